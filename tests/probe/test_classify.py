"""The follow-up classifier, on real turns from ../shared/data and on hand-made cases for every label."""

import random
from collections import Counter, defaultdict

import pytest

from uturn_train.probe.rules.classify import LABELS, Verdict, classify_turn
from uturn_train.probe.rules.text import context
from uturn_train.tasks import load_task


def rate(verdicts, labels) -> float:
    return sum(v.label in labels for v in verdicts) / len(verdicts)


def why(share: float, verdicts) -> str:
    return f"measured {share:.3f} of {len(verdicts)}; labels: {dict(Counter(v.label for v in verdicts).most_common())}"


@pytest.fixture(scope="module")
def oasst(shared_data):
    return load_task("oasst", str(shared_data / "oasst" / "en_100_tree.jsonl"))


@pytest.fixture(scope="module")
def gsm8k(shared_data):
    return load_task("gsm8k", str(shared_data / "gsm8k" / "test.jsonl"))


def test_real_followups_are_followups(oasst):
    verdicts = [classify_turn(e.query, e.answer, e.reference_followup) for e in oasst]
    # Misses include real turns that are pure thanks, change the subject or paste an answer (27 of the 380, by
    # reading them); 0.87 of all and 0.93 of the real follow-ups when written.
    assert (share := rate(verdicts, {"followup"})) >= 0.85, why(share, verdicts)


def test_followups_of_another_conversation_are_mostly_not(oasst):
    # Pair each real follow-up with the query and answer of a conversation from another tree.
    others = random.Random(0).sample(list(oasst), len(oasst))
    verdicts = []
    for i, e in enumerate(oasst):
        other = next(o for o in others[i:] + others[:i] if o.meta["message_tree_id"] != e.meta["message_tree_id"])
        verdicts.append(classify_turn(other.query, other.answer, e.reference_followup))
    # Generic follow-ups ("Can you explain that more simply?") fit any conversation, and so do references back ("Are
    # they free?", "Can you add comments?", "Try again but this time ..."): a real follow-up is made to lean on its
    # conversation; 0.345 when written, 0.353 once reworks under a new constraint counted as references back (issue
    # 10). Telling such turns apart from grounded ones is the grounded decision's job (test_grounding.py).
    assert (share := rate(verdicts, {"followup"})) <= 0.36, why(share, verdicts)
    assert (share := rate(verdicts, {"new_topic"})) >= 0.58, why(share, verdicts)


def test_another_answer_to_the_same_query_is_drift(oasst):
    answers = defaultdict(dict)  # (tree, query) -> {answer message id: answer}
    for e in oasst:
        answers[e.meta["message_tree_id"], e.query][e.meta["answer_message_id"]] = e.answer
    pairs = [(q, a, b) for (_, q), by_id in answers.items() for a in by_id.values() for b in by_id.values() if a != b]
    assert len(pairs) >= 50
    verdicts = [classify_turn(query, answer, sibling) for query, answer, sibling in pairs]
    # 0.90 and 0.08 when written.
    assert (share := rate(verdicts, {"identity_drift", "repetition"})) >= 0.88, why(share, verdicts)
    assert (share := rate(verdicts, {"followup"})) <= 0.1, why(share, verdicts)


def test_repeating_the_query_or_the_answer(oasst):
    for turn_of in (lambda e: e.query, lambda e: e.answer):
        verdicts = [classify_turn(e.query, e.answer, turn_of(e)) for e in oasst]
        assert (share := rate(verdicts, {"repetition"})) == 1.0, why(share, verdicts)


def slightly_edited(text: str) -> str:
    """Drops every 12th word and changes every 15th, as a model copying a turn with small slips would."""
    words = text.split()
    return " ".join("very" if i % 15 == 7 else w for i, w in enumerate(words) if i % 12 != 5)


def test_a_slightly_edited_copy_is_repetition(oasst):
    long_enough = [e for e in oasst if len(e.query.split()) >= 20 and len(e.answer.split()) >= 20]
    assert len(long_enough) >= 50
    for turn_of in (lambda e: e.query, lambda e: e.answer):
        verdicts = [classify_turn(e.query, e.answer, slightly_edited(turn_of(e))) for e in long_enough]
        assert (share := rate(verdicts, {"repetition"})) >= 0.95, why(share, verdicts)


def test_gsm8k_solution_in_the_user_turn_is_drift(gsm8k):
    # The context holds a bare final answer; the user turn solves the question again, with and without "#### N".
    for turn_of in (lambda e: e.meta["solution"], lambda e: e.answer.rsplit("\n####", 1)[0]):
        verdicts = [classify_turn(e.query, f"The answer is {e.gold}.", turn_of(e)) for e in gsm8k]
        assert (share := rate(verdicts, {"identity_drift"})) >= 0.98, why(share, verdicts)  # 0.995 when written


def test_another_gsm8k_question_is_a_new_topic(gsm8k):
    verdicts = [classify_turn(e.query, e.answer, gsm8k[(i + 1) % len(gsm8k)].query) for i, e in enumerate(gsm8k)]
    # Misses share words a word problem has by chance ("money", "hours"); 0.955 when written.
    assert (share := rate(verdicts, {"new_topic"})) >= 0.94, why(share, verdicts)


@pytest.mark.parametrize("lead_in", ["Next question: ", "Ok, next one. ", "Q2: ", "New problem: ", "Unrelated, but "])
def test_an_announced_next_question_is_a_new_topic_whatever_it_shares(gsm8k, lead_in):
    # The same worksheet's next problem shares words with the answer ("$", "each", "total"); the lead-in settles it,
    # unless the turn points back at the answer.
    verdicts = [classify_turn(e.query, e.answer, lead_in + gsm8k[(i + 1) % len(gsm8k)].query)
                for i, e in enumerate(gsm8k)]
    assert (share := rate(verdicts, {"new_topic"})) >= 0.995, why(share, verdicts)
    assert classify_turn(QUERY, ANSWER, lead_in + "why did you say that?").label == "followup"


@pytest.mark.parametrize(
    "turn,label",
    [
        ("Natalia sold 30 clips in June. In July she sold 12 more. How many did she sell in both months?", "new_topic"),
        ("Tom has 3.5 kg of flour. He uses 1.5 kg. How much is left?", "new_topic"),
        ("What if she sold 60 clips in April instead?", "followup"),
        ("In May she sold 24 clips. Why did you divide 48 by 2?", "followup"),
        ("But she sold 48 in April. So why is May 24?", "followup"),
    ],
)
def test_a_problem_with_its_own_numbers_is_a_new_topic_even_on_the_same_subject(turn, label):
    assert classify_turn(QUERY, ANSWER, turn).label == label


def test_mtbench_second_turns_are_followups(shared_data):
    # Turn 2 was written as a follow-up of turn 1 without seeing an answer; the context has none either.
    examples = load_task("mtbench", str(shared_data / "mt_bench" / "question.jsonl"))
    verdicts = [classify_turn(e.query, "", e.reference_followup) for e in examples]
    assert (share := rate(verdicts, {"followup"})) >= 0.86, why(share, verdicts)  # 0.89 when written


def test_instruction_prompts_after_an_unrelated_conversation_are_not_followups(shared_data, oasst):
    prompts = [e.query for e in load_task("ifeval", str(shared_data / "ifeval" / "input_data.jsonl"))]
    prompts += [e.query for e in load_task("ifbench", str(shared_data / "ifbench" / "IFBench_test.jsonl"))]
    contexts = [oasst[i % len(oasst)] for i in range(len(prompts))]
    verdicts = [classify_turn(c.query, c.answer, prompt) for c, prompt in zip(contexts, prompts)]
    # "in your response", "the previous one", "Is it true that ..." name the prompt's own parts; 0.03 and 0.90 when
    # written.
    assert (share := rate(verdicts, {"followup"})) <= 0.05, why(share, verdicts)
    assert (share := rate(verdicts, {"new_topic"})) >= 0.85, why(share, verdicts)


QUERY = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?"
)
ANSWER = "In April she sold 48 clips. In May she sold 48 / 2 = 24 clips. Altogether she sold 48 + 24 = 72 clips."
rng = random.Random(0)
MASH = " ".join("".join(rng.choice("qwertyuiopasdfghjklzxcvbnm") for _ in range(rng.randint(4, 9))) for _ in range(12))
SOUP = "".join(rng.choice("!@#$%^&*()_+{}|:<>?~`-=[]\\;',./") for _ in range(80))
SALAD = "ing Hol .)));  ürü bicycle Tom(expected Municipal --> '../../ Blanc Cos ((_ ( pe mo'inz ط TT Apr Lect "
SALAD += "];//_ serial"

CASES = {
    "empty": ["", "  \n\t", "<|im_end|>", "<|eot_id|><|eot_id|>", "</s>", "<end_of_turn>", "<|im_end|>\n<|im_start|>"],
    "degenerate": [
        "the " * 40,
        "Can you explain step 2 again? " * 20,
        "!" * 60,
        "谢谢" * 60,
        "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16",
        MASH,
        SOUP,
        SALAD,
    ],
    "identity_drift": [
        "<|im_start|>assistant\nNatalia sold 72 clips.",
        "<|start_header_id|>assistant<|end_header_id|>\n\nShe sold 72 clips.",
        "<start_of_turn>model\nThe answer is 72.",
        "<｜Assistant｜>She sold 72 clips.",
        "Why 24?[/INST] Because 48 / 2 = 24.",
        "Assistant: She sold 72 clips in total.",
        "Sure! Here's how to solve it: divide 48 by 2 to get 24, then add 48 and 24.",
        "I hope this helps! Let me know if you have any other questions.",
        "As an AI language model, I do not sell clips.",
        "How can I assist you today?",
        "You're welcome! Is there anything else I can help you with?",
        "To solve this, we first find the clips sold in May, 48 / 2 = 24, and then add 48 + 24 = 72.",
        "**Step 1:** 48 / 2 = 24 clips in May.\n**Step 2:** 48 + 24 = 72 clips in total.\n#### 72",
        "In May, she sold half of 48, which is 24, so altogether she sold 72 clips.",
        "Hello! How can I assist you today?",
        "Okay, the user is asking how many clips Natalia sold. Let me work it out.",
        "<think>\nOkay, so the user wants the total.\n</think>\n\nShe sold 72 clips altogether.",
        "Great question! She sold 48 clips in April and 24 in May.",
    ],
    "repetition": [QUERY, ANSWER, QUERY.upper(), QUERY.replace("48", "50"), QUERY.split(". ")[1]],
    "acknowledgement": ["Thanks!", "Thank you so much, that was really helpful!", "Got it, that's all.", "No thanks."],
    "followup": [
        "Thanks! Can you also show it for 7?",
        "Why did you divide 48 by 2?",
        "What if she had sold 60 clips in April instead?",
        "I think the answer should be 96, not 72.",
        "Can you explain it more simply?",
        "How many clips did she sell in May, then?",
        "Can you make a similar problem for me to practice?",
        "Why did you divide 48 by 2?<|im_end|>",
        "Thanks, but that's wrong.",
    ],
    "new_topic": [
        # After a word problem, a question about its story that does not point back at the answer (issue 17).
        "How many clips did she sell in May?",
        "What is the capital of France?",
        "Write a poem about the ocean.",
        "Tom has 5 apples and buys 7 more. How many apples does Tom have now?",
        "How do I bake sourdough bread at home?",
    ],
}


@pytest.mark.parametrize("label,turn", [(label, turn) for label, turns in CASES.items() for turn in turns])
def test_hand_made_cases(label, turn):
    verdict = classify_turn(QUERY, ANSWER, turn)
    assert verdict.label == label, verdict
    assert verdict.reason and verdict.is_followup == (label == "followup")


CODE_QUERY = "Write a Python function that checks whether a number is prime."
CODE_ANSWER = (
    "Here is a function:\n```python\ndef is_prime(n):\n    if n < 2:\n        return False\n"
    "    for d in range(2, int(n ** 0.5) + 1):\n        if n % d == 0:\n            return False\n"
    "    return True\n```\nIt tries every divisor up to the square root of n."
)
# Real follow-ups often share no word with the answer: they lean on it. Turns with a subject of their own do not.
LEANING = {
    "followup": [
        "Can you add comments?",  # a rework of what is there
        "Make it shorter.",
        "Now do it in Rust.",
        "Translate it to JavaScript.",
        "Could you rewrite the code without the loop?",
        "Can you explain it more simply?",
        "Is there a faster way?",  # a comparison with the answer
        "What does this line do?",  # a demonstrative
        "What is the time complexity of this algorithm?",
        "Explain the second line.",
        "Why does that work?",  # a pronoun that stands for the answer
        "Which one is faster?",
        "Do I have to?",  # a clipped question
        "But what about negative numbers?",
        "Are you sure?",  # a challenge
        "That's wrong.",
        "I don't understand the loop part.",
    ],
    "new_topic": [
        "What is the capital of France?",
        "Translate 'good morning' into French.",
        "Can you explain quantum entanglement more simply?",
        "What is it like to live in Japan?",  # an "it" that stands for nothing
        "How long does it take to boil an egg?",
        "Now tell me about the history of the Roman Empire.",
        "I'd like to plan a trip to Portugal. What should I pack for that?",  # "that" is the trip
        "Write a haiku about autumn leaves.",
        "What should I cook for dinner tonight?",
        "Is it safe to eat raw cookie dough?",
        "Can you recommend a good book about World War II?",
        "What is your name?",  # about the assistant, not the answer
        "What can you do?",
    ],
}


@pytest.mark.parametrize("label,turn", [(label, turn) for label, turns in LEANING.items() for turn in turns])
def test_followups_that_lean_on_the_answer(label, turn):
    verdict = classify_turn(CODE_QUERY, CODE_ANSWER, turn)
    assert verdict.label == label, verdict


@pytest.mark.parametrize(
    "turn,label",
    [
        ("Can you add comments?", "followup"),
        ("Make it shorter.", "followup"),
        ("Are you sure?", "followup"),
        ("Can you explain that more simply?", "followup"),
        ("Now do it in Rust.", "followup"),
        ("Can you explain quantum entanglement more simply?", "new_topic"),
        ("Translate 'good morning' into French.", "new_topic"),
    ],
)
def test_a_short_request_after_an_unrelated_conversation(turn, label):
    # The rule in the module docstring: the generic form fits any answer; a subject of its own makes a new topic.
    assert classify_turn(QUERY, ANSWER, turn).label == label


def test_replies_to_what_the_assistant_asked():
    query, answer = "Can you write me a short script that renames all files in a folder?", (
        "Sure. Which language would you like it in, and should it rename files in subfolders too?"
    )
    assert classify_turn(query, answer, "Python, please.").label == "followup"
    assert classify_turn(query, answer, "No, just the top folder.").label == "followup"
    assert classify_turn(query, answer, "Write a haiku about autumn leaves.").label == "new_topic"
    # Asked for a text, the user pastes one, however much it reads like an answer.
    query, answer = "Can you summarize an article for me?", "Sure, please paste the text you want me to summarize."
    text = (
        "Yes, here's the text: Researchers have found that city trees lower summer temperatures by several degrees. "
        "You can see the effect in satellite images, and it is strongest where the canopy is dense. Additionally, the "
        "shade reduces the energy used for air conditioning, which means lower bills for residents."
    )
    assert classify_turn(query, answer, text).label == "followup"
    assert classify_turn(query, "Here is a summary: trees cool cities.", text).label == "identity_drift"


def test_a_question_about_the_assistant_follows_only_a_conversation_about_it():
    assert classify_turn("Who are you?", "I am an AI assistant.", "What can you do?").label == "followup"
    assert classify_turn(QUERY, ANSWER, "What can you do?").label == "new_topic"


def test_a_loop_cut_off_at_the_token_limit():
    turn = (
        "Thanks for the explanation! I understand April now, but I am not sure why May is exactly half of April, "
        "and how the total of 72 follows from it. " + "Could you explain May again? " * 7
    )
    # A few repeats at the end of a turn the model ended itself are not a loop; the same, cut off by the limit, are.
    assert classify_turn(QUERY, ANSWER, turn, finish_reason="stop").label == "followup"
    assert classify_turn(QUERY, ANSWER, turn, finish_reason="length").label == "degenerate"
    assert classify_turn(QUERY, ANSWER, "Can you explain how you got 72?", finish_reason="length").label == "followup"
    loop = "Could you explain May again? " * 30
    assert classify_turn(QUERY, ANSWER, loop, finish_reason="stop").label == "degenerate"


def test_deterministic(oasst):
    turns = [(e.query, e.answer, e.reference_followup) for e in oasst]
    first = [classify_turn(*t) for t in turns]
    context.cache_clear()
    assert [classify_turn(*t) for t in turns] == first
    assert all(isinstance(v, Verdict) and v.label in LABELS and v.reason for v in first)
    with pytest.raises(AttributeError):
        first[0].label = "followup"


def test_validity_on_real_turns_not_tuned_on(shared_data):
    # The held-out half of the labelled OASST turns, MT-Bench's second turns and the negatives built from that half
    # (eval/classifier_validity.py prints every source; the rules were changed looking at the dev half only).
    from uturn_train.probe.validity import human_turns as validity

    scores = validity.scores(validity.sources(shared_data)["test"])
    assert scores["followup"]["f1"] >= 0.90, scores["followup"]
    for label in ("identity_drift", "repetition", "new_topic", "empty", "degenerate"):
        assert scores[label]["support"] >= 20 and scores[label]["f1"] >= 0.85, (label, scores[label])


ASKS = ("Which bank branch has the longest opening hours?",
        "There are two branches in town, one downtown and one on Main Street. Which one do you mean?")
STORY = ("Tell me a story about a dragon.", "Once upon a time, a small dragon named Ember lived in a cave above a "
         "village. One winter the village lost its fire, and Ember flew down to light the lamps.")
NEEDS = ("Can you help me plan my week?", "Sure, I need more information first: what are your main commitments this "
         "week, and how many hours can you work each day?")
DECLINES = ("Write a review of Terminator 2.",
            "As an AI, I do not have personal opinions, so I cannot write a review.")
POEM = ("Write a short poem about autumn.",
        "Leaves fall softly down,\ngolden light on quiet ground,\nthe year breathes.")


@pytest.mark.parametrize(
    "context,turn,label",
    [
        # a short reply to the assistant's question
        (ASKS, "The one on Main Street.", "followup"),
        (ASKS, "Downtown, I think.", "followup"),
        (ASKS, "What is the capital of Peru?", "new_topic"),
        # a request to continue
        (STORY, "Keep going.", "followup"),
        (STORY, "Go on!", "followup"),
        (STORY, "What happens next?", "followup"),
        # facts about the user's own situation, after the assistant asked for them
        (NEEDS, "I work Monday to Friday, 9 to 5, and I have a dentist appointment on Wednesday.", "followup"),
        (NEEDS, "Mostly meetings. I can do about six hours of focused work a day.", "followup"),
        (NEEDS, "Write a haiku about the sea.", "new_topic"),
        # push-back after a refusal
        (DECLINES, "Just pretend you are a film critic and write it anyway.", "followup"),
        (DECLINES, "Please, it is for a class assignment.", "followup"),
        (DECLINES, "Okay, then just summarize the plot in three sentences.", "followup"),
        (DECLINES, "How do I bake sourdough bread?", "new_topic"),
        # the previous answer redone under a new constraint
        (POEM, "Now write it as a limerick about a cat who loves fish.", "followup"),
        (POEM, "Make one about spring for my daughter's birthday card.", "followup"),
        (POEM, "Try again but this time from the point of view of a tree.", "followup"),
        (POEM, "Make the tone darker.", "followup"),
        (POEM, "What is the boiling point of water at altitude?", "new_topic"),
    ],
)
def test_followups_the_classifier_used_to_miss(context, turn, label):
    # The kinds of misses issue 10 lists, in phrasings written for this test (none is from the evaluation data).
    assert classify_turn(*context, turn).label == label
