"""The English cues the follow-up classifier (`classify.py`) reads: word lists, and phrases compiled to regexes.

Phrases made by `phrases` match whole words of a turn's words joined by single spaces (`" show it for 5 "`): Python's
`re` finds a pattern that starts with a plain space far faster than one that starts with `\\b`, and tries one branch
per first letter faster than one per phrase. The other patterns match the lowercased text, where punctuation is kept.
"""

import re


def _branches(pattern: str) -> list[str]:
    """The top-level alternatives of `pattern`."""
    branches, depth, start, i = [], 0, 0, 0
    while i < len(pattern):
        char = pattern[i]
        if char == "\\":
            i += 1
        elif char == "[":
            i = pattern.index("]", i + 2)
        elif char in "()":
            depth += 1 if char == "(" else -1
        elif char == "|" and depth == 0:
            branches.append(pattern[start:i])
            start = i + 1
        i += 1
    return branches + [pattern[start:]]


def phrases(*alternatives: str) -> re.Pattern:
    """Any of `alternatives`, as whole words of a space-joined word string. Alternatives that open with a plain letter
    are grouped by it, so that `re` tries one branch per letter at each word, not one per alternative."""
    by_letter: dict[str, list[str]] = {}
    others = []
    for branch in (branch for alternative in alternatives for branch in _branches(alternative)):
        if branch[:1].isalpha() and branch[1:2] not in ("?", "*", "+", "{"):
            by_letter.setdefault(branch[0], []).append(branch[1:])
        else:
            others.append(branch)
    grouped = [f"{letter}(?:{'|'.join(rests)})" for letter, rests in by_letter.items()]
    return re.compile(" (?:" + "|".join(grouped + others) + ")(?= )")


def _by_first_letter(words: str) -> str:
    """An alternation of `words` grouped by first letter: `re` tries 26 branches at a position instead of 100."""
    groups: dict[str, list[str]] = {}
    for word in sorted(set(words.split()), key=lambda w: (-len(w), w)):  # longest first: "rewrite" before "re..."
        groups.setdefault(word[0], []).append(re.escape(word[1:]))
    return "|".join(f"{first}(?:{'|'.join(rests)})" for first, rests in sorted(groups.items()))


# Chat-template markup. Special tokens look alike across templates (`<|im_start|>`, `<|eot_id|>`, `<｜Assistant｜>`,
# `<start_of_turn>`, `</s>`, `[INST]`), so they are matched by shape; a role header is such a token next to a role.
_TOKEN = r"(?:<[|｜][^<>\n]{0,40}?[|｜]>|</?(?:s|eos|bos|pad|unk|think|[a-z]+(?:_[a-z]+)+)>|\[/?INST\])"
_ASSISTANT_ROLE = r"(?:assistant|model|bot|chatbot|gpt|ai)"
ASSISTANT_HEADER = re.compile(
    rf"{_TOKEN}[ \t]*\n?[ \t]*{_ASSISTANT_ROLE}\b"  # <|im_start|>assistant, <start_of_turn>model
    rf"|<[|｜]\s*{_ASSISTANT_ROLE}\s*[|｜]>"  # <|assistant|>, <｜Assistant｜>
    r"|\[/INST\]"  # Llama-2 and Mistral: what follows [/INST] is the assistant's
    r"|^[ \t]*(?:#+[ \t]*)?(?:\*\*)?(?:ai[ \t]+)?assistant(?:\*\*)?[ \t]*:",  # "Assistant:", "### Assistant:"
    re.IGNORECASE | re.MULTILINE,
)
MARKUP = re.compile(rf"{_TOKEN}(?:[ \t]*(?:user|human|prompter|system)\b)?", re.IGNORECASE)

# Words. Content words leave out function words and words too generic to show that a turn refers to *this* exchange.
WORD = re.compile(r"[a-z0-9]+(?:[.,'][a-z0-9]+)?")
STOPWORDS = frozenset(
    """a about above after again against all also am an and any are as at be because been before being below between
    both but by can cannot could did do does doing down during each else even ever every few for from further had has
    have having he her here hers herself him himself his how however i if in into is it its itself just let me might
    more most much must my myself no nor not now of off on once only or other ought our ours ourselves out over own
    same shall she should so some such than that the their theirs them themselves then there these they this those
    though through to too under until up upon us very was we were what when where whether which while who whom whose
    why will with would yet you your yours yourself yourselves ok okay yes yeah yep nope oh hi hello hey please pls
    thanks thank thx wow can't don't doesn't didn't isn't aren't wasn't won't wouldn't couldn't shouldn't i'm i've
    i'd i'll it's that's what's there's you're you've you'd you'll let's dont doesnt didnt cant im without within
    along across toward towards among via etc since""".split()
)
GENERIC = """question problem answer explain explanation example help helpful tell know think thought mean meant want
    need like good great best better bad sure really actually thing way use used using make made get got give show
    write say said see look looking find try going come take lot kind sort new different another many something
    anything everything nothing someone anyone one two first second third last next still well right wrong true false
    correct simple simpler simply detail detailed information info less part step point idea work time instead maybe
    possible specific general certain basically exactly stuff whole bit little long short able following previous
    response reply text list describe description provide suggest suggestion recommend understand clarify elaborate
    expand continue rewrite case option word sentence per total half twice amount number left advice tip topic enough
    change start begin add create done found trying other others making getting having things ways include ask
    important top keep happen""".split()

# A capitalised word inside a sentence: a name, which gives a request a subject of its own ("... live in Japan?").
NAME = re.compile(r" (?<=[a-z0-9,;:] )([A-Z][A-Za-z0-9]+(?:[-.'][A-Za-z0-9]+)*)")

# The assistant's voice. Stock phrases (offers, sign-offs, self-description, solution markers) settle it.
HELPER = phrases(
    r"i hope (?:this|that|it|my|the)(?: [a-z']+){0,6}? (?:helps?|clarifies|answers|is useful|assists)",
    r"hope (?:this|that) helps|let me know (?:if|and)|feel free to|here to help|don't hesitate to",
    r"anything else (?:i|we|you'd|you would|you|that you)? ?(?:can|could|might|may|like|need)",
    r"(?:how|what) (?:else )?(?:can|may) i (?:help|assist|do for)|(?:can|may) i (?:help|assist) you",
    r"would you (?:like|want) me to|you(?:'d| would) like me to|would you like (?:to know|more|any|a)",
    r"what (?:else )?would you like to (?:know|do|discuss|talk about|learn)|can i (?:provide|help with) anything",
    r"do you have (?:any )?(?:other |more |further )?questions|i(?:'ve| have| was| am) (?:been )?trained (?:on|by)",
    r"as an? (?:text based )?ai|as a (?:large )?language model|i(?:'m| am) not a (?:person|human|real person)",
    r"i(?:'m| am) (?:just |only )?(?:a|an) (?:[a-z-]+ ){0,2}(?:program|bot|chatbot|language model|ai|machine)",
    r"(?:are|were) you (?:looking for|interested in)|help me understand (?:your|what you)",
    r"(?:what|which) (?:sort|kind|type) of [a-z]+ (?:most )?interests you",
    r"i(?:'m| am) (?:just )?an? (?:ai|artificial|open source|language model|virtual|chatbot|assistant)",
    r"i (?:cannot|can't|am unable to|am not able to) (?:help you|assist you|browse|access the internet|access real|"
    r"answer (?:that|this|your))|i(?:'m| am) not (?:connected|able to connect) to the internet",
    r"(?:i'd|i would|i'm|i am) (?:be )?(?:happy|glad|delighted) to (?:help|assist|explain|provide)",
    r"(?:happy|glad) (?:i could |to )help|you(?:'re| are) (?:very |most |quite |so )?welcome",
    r"thanks? (?:you )?for (?:your question|asking|reaching out|the question|contacting)",
    r"the user (?:is asking|has asked|asked (?:me|about|for|how|what|whether)|wants (?:to know|me to)|is requesting)",
    r"final answer is|let's (?:break (?:it|this) down|calculate|solve|compute|denote|think step by step|work through)",
    r"(?<=^ )(?:great|good|excellent|interesting) question|that's a (?:great|good|excellent|interesting) question",
)
HELPER_OPENING = re.compile(
    r"\W*(?:sure|certainly|of course|absolutely)\b[!,.]?\s*(?:thing[!,.]?\s*)?(?:here(?:'s| is| are)\b|"
    r"i(?:'ll| will|'d| would| can)\b|let(?:'s| me)\b)"
)
# Other cues only weigh in. Openings an answer has, but a user's may too ("Here is my code: ...").
ANSWER_OPENING = re.compile(
    r"\W*(?:(?:sure|certainly|of course|absolutely)\b[!.,]\s*\S|here(?:'s| is| are) (?:a|an|the|some|how|what|why|"
    r"\d+|several|few|more)\b)"
)
# Explaining and advising: "you can ...", "if you ...", "here are", "additionally".
EXPLAINS = phrases(
    r"you(?:'ll|'d| will| can| could| should| might| may| must| need| have to| want to| would)",
    r"(?<! as )if you|keep in mind|note that|it(?:'s| is) (?:important|recommended|advisable|best|a good idea)",
    r"here (?:are|is)|there are (?:many|several|a few|some|various|two|three|a number)|depend(?:s|ing)? on",
    r"additionally|in addition|furthermore|moreover|overall|in other words|this is because",
    r"(?:this|which) (?:means|allows|helps|ensures)|based on (?:your|the information)|in summary|in conclusion",
    r"to summarize|i apologi[sz]e|i(?:'m| am) sorry (?:for|about|but|if)",  # a user may apologize too
)
# A request that sets the assistant a role or rules ("I want you to act as ...", "Your task is ..."): its "you will"
# and "you should" instruct, they do not advise.
INSTRUCTS = phrases(
    r"i(?: want| need|'d like| would like) you to|act as|pretend (?:to be|you(?:'re| are))|imagine (?:that )?you",
    r"your (?:task|job|role|goal) is",
    r"you are (?:now |going to be )?(?:an?|my) [a-z]+(?: [a-z]+)? (?:who|that|and|for|in)",
)
# What the assistant made or holds, that a user asks about ("your answer", "your code").
_ITS_OWN = (
    r"answer|response|reply|explanation|example|solution|code|list|script|suggestion|approach|method|version|story|"
    r"poem|essay|joke|text|thought|opinion|view|name|training|knowledge|creator|developer|logo|own|previous|last|first|"
    r"second|third|earlier|original|above|help|advice|recommendation|idea|point|output|program|source|data|model|"
    r"capabilit|abilit|limitation|favou?rite|perspective|context|memory|purpose|instruction|rule|strateg|work|input|"
    r"feedback|plan|draft|outline|summary|translation|calculation|assumption|claim|statement|reasoning|logic"
)
# Talking about the user's things ("your eyes", "your app"), where a user talks about the assistant's ("your answer").
YOUR_THING = phrases(rf"your (?!(?:{_ITS_OWN})[a-z]*(?= ))[a-z0-9']+")
STRUCTURE = re.compile(r"^[ \t]*(?:[-*•]|\d+[.)]|#{1,4}|```|step \d+)[ \t]", re.MULTILINE)
EQUATION = re.compile(r"\d(?: ?[a-z/%]+){0,2} ?[-+*/×x÷] ?\$?\.?\d[\d.,]*(?: ?[a-z/%]+){0,2} ?= ?\$?\d|<<[^<>]*>>")

# The user's voice. Verbs a request opens with; not the ones an answer advises with ("try", "use", "consider").
_REQUEST_VERB = _by_first_letter(
    """adapt add adjust alter amend analyze analyse answer apply argue assess calculate change check cite clarify
    classify compare compose compute condense continue convert correct count craft create critique debug define
    describe design determine discuss dive double draft draw edit elaborate embed estimate evaluate expand explain
    express extend find finish fix format generate give group guess help highlight identify illustrate imagine
    implement improve include incorporate justify label let's list modify name optimize optimise organize outline
    paraphrase pick plot predict pretend prove provide rank recommend redo refactor reformulate remove rephrase replace
    repeat reply respond return review reword rework rewrite revise say shorten show simplify solve sort specify
    suggest summarize summarise suppose assume take teach tell translate turn update verify walk write"""
)
_REQUEST_VERB = rf"(?:{_REQUEST_VERB}|come up|make(?! sure)|keep(?= going| on| it| them| the)|go on|carry on)\b"
# How a user turn opens when it asks without a question mark ("what is contour lines", "Explain it line by line").
ASK_OPENING = re.compile(
    r"\W*(?:(?:and|but|so|ok|okay|then|also|now|well|great|cool|nice|perfect|yes|no|wait|hmm|please|ah|oh|thanks|"
    r"thank you|just|fine|alright|all right)[,.!]?\s+)*(?:(?:what|why|how|when|where)(?:'s|\s+(?:is|are|was|were|do|"
    r"does|did|can|could|would|will|should|to|about|many|much|long|often|if|else|kind|type|sort|exactly))\b|(?:which|"
    r"who|whom|whose|is|are|was|"
    rf"were|do|does|did|can|could|would|will|should|shall|any|now)\b|{_REQUEST_VERB})"
)
# A request further in, after some context: "... If there were 20 helmets, calculate the total."
ASK_LATER = re.compile(
    rf"[.!?:;,\n]\s*(?:now |please |so |and |but )?(?:{_REQUEST_VERB}|(?:what|why|how)(?:'s| (?:is|are|do|does|can|"
    r"could|should|would|will)\b))"
)
ASK_PHRASE = phrases(
    r"please|pls|plz|(?:can|could|would|will) (?:you|u|we)|help me|tell me|give me|show me",
    r"i(?: would|'d) like|(?<! all )i (?:want|wanted|need|needed|wish)(?! to thank)",
    r"i(?:'m| am) (?:looking|trying|asking|wondering|curious|interested|confused|not sure)",
    r"i was (?:wondering|hoping|asking)|i meant|i have (?:a|another|one more) (?:question|problem|issue)",
    r"i (?:don't|do not|didn't|still don't) (?:understand|get|see|mean|think|know|like|want)",
    r"what about|how about|what if|and (?:for|in|with|if)|instead|what happens (?:next|now|then|if|when|to)|now what",
)
FIRST_PERSON = phrases(r"i|i'm|i've|i'd|me|my")
# A short statement still reads as the user's when it reacts: to the assistant, or to "that" ("Yes, that's correct"
# is not among them: an answer opens that way too). Pushing back does as well, unless the statement restates the
# answer, which may well say "not" itself.
REACTS = phrases(
    r"you|your|you're|wrong|incorrect|mistake|hmm|lol|haha|(?<=^ )(?:wait|oh)",
    r"(?:that|this|it)(?:'s| is| was| isn't| doesn't| does) (?:not|wrong|incorrect|false|untrue|bad|terrible|useless|"
    r"confusing|unclear|weird|strange|funny|boring|disappointing)",
)
PUSHBACK = phrases(r"no|nope|not|never|but|however|though|actually|wrong|incorrect|mistake|[a-z]+n't")
THANKS = re.compile(
    r"\b(?:i (?:want|wanted|would like|'d like) to |no )?(?:thanks?|thx|appreciate[sd]?|grateful)\b"
    r"(?: (?:you|u|so much|a lot|very much|again|a bunch|a ton|for [^.?!\n]{0,60}))*"
)
CLOSER = phrases(
    r"(?:that's|that is) all(?: i (?:need|needed|wanted))?|bye|goodbye|good night|have a (?:nice|good|great) [a-z]+",
    r"take care|got it|makes sense|that (?:helps|helped|works|worked)|i (?:see|understand)|no more questions",
    r"(?:(?:this|that|it)(?:'s| is| was) (?:very |really |so )?)?(?:great|helpful|perfect|awesome|useful|clear|"
    r"amazing|good|nice|interesting|cool|wonderful|excellent|ok|okay|alright|wow|brilliant|fantastic|lovely)",
    r"i(?:'ll| will) (?:try|give|do) (?:it|that|this)(?: a try)?",
)
# The answer's last words ask the user for something ("Please specify the city"; a question mark does too), or for
# material to work on ("Could you provide the text?").
ASKS_USER = phrases(
    r"please (?:provide|share|send|paste|give|tell|describe|specify|clarify|upload|post|write|enter|let me know "
    r"(?:what|which|how|whether))"
)
WANTS_MATERIAL = phrases(
    r"(?:please|could you|can you|would you)(?: please)? (?:provide|share|send|paste|give|upload|post|copy)",
    r"(?:provide|share|send|paste|give|upload|post) (?:me|us) (?:with )?(?:the|your|a|an|some)",
)
# The answer falls short. It lacks something: it does not know or follow, or needs more from the user, who tells it
# next. Or it declines, and the user presses the request.
LACKS = phrases(
    r"i (?:do not|don't|can not|cannot|can't) (?:know|understand|comprehend|tell|see|find|predict|say|put)",
    r"i(?:'m| am) (?:unaware|not sure|not familiar|not aware)|(?:not|impossible) (?:possible|able) to (?:make|give|"
    r"provide|say|predict|answer|tell|know)|(?:without|need|needs|require|requires) (?:more|further|additional|some) "
    r"(?:information|info|context|details)|(?:what|which|how) do you mean|(?:can|could) you (?:clarify|specify|"
    r"elaborate|rephrase|tell me more|be more)",
    r"(?:don't|do not) (?:quite )?(?:get|understand|follow) (?:what|your|the)",
    r"let me know (?:what|which|how|more)",
)
DECLINES = phrases(
    r"i (?:can't|cannot|am unable to|am not able to|won't|will not|can not) (?:help|assist|provide|write|answer|do|"
    r"comply|create|generate|access|browse|give)|i(?:'m| am) (?:sorry|afraid|not able|unable)|as an? (?:ai|language "
    r"model)|i (?:do not|don't) have (?:personal|access|the ability)",
)
# The user presses a request the assistant declined ("Just pretend you are a critic.", "It's for a school project.").
INSISTS = phrases(
    r"anyway|anyways|anyhow|regardless|just|still|i know|i insist|come on|i(?:'m| am) (?:asking|not asking)",
    r"(?:it's|it is|this is) (?:for|just|only)|pretend|hypothetical(?:ly)?|imagine|fictional",
)
# How a short reply to the assistant's question opens ("No, just the top folder.").
REPLY_OPENING = re.compile(
    r"\W*(?:yes|yeah|yep|no|nope|sure|ok|okay|only|just|both|neither|either|none|all|any|maybe|probably|definitely|"
    r"mostly|i|i'm|i'd|i'll|my|we|our|(?:the|that|this) (?:one|ones|first|second|third|last|other|latter|former))\b"
)
# A turn that restates the request and says so ("I actually wanted you to ...", "No, I meant ...") is not a copy.
RESTATES = re.compile(
    r"\W*(?:no|nope|but|actually|again|as i said|like i said|what i (?:want|wanted|meant|asked)|i (?:actually |really "
    r"|just |only )?(?:wanted|want|meant|mean|asked|said|need|needed)(?! to thank))\b"
)
# Material pasted after a colon: a text in quotes or backticks, or on the next line.
MATERIAL = re.compile(r":[ \t]*(?:\n|[\"“'`])")
# The turn hands over what the assistant asked for ("Yes, here's the abstract: ...", "Here is my code").
SUPPLIES = re.compile(r"\W*(?:(?:yes|yeah|ok|okay|sure)\b[,.!]?\s*here(?:'s| is| are)\b|here(?:'s| is| are) my\b)")

# Questions about the assistant itself ("What is your name?", "What can you do?"): a topic of their own, unless the
# conversation is about the assistant.
ABOUT_ASSISTANT = phrases(
    r"(?:who|what) (?:are|made|created|built|trained|developed) you|what(?:'s| is) your (?:name|purpose|favou?rite)",
    r"what (?:else )?can you (?:do|help)|how (?:do )?you work|are you (?:an? )?(?:ai|bot|robot|human|real|person|"
    r"conscious|sentient|alive)|can you (?:access|browse|remember)|(?:things|what) you can(?:'t| not|not) (?:do|help)",
    r"how are you|tell me about yourself|(?:do|can) you (?:have|feel) (?:feelings|emotions)",
)

# A turn that announces its question as the next item ("Next question: ...", "Q2:", "Unrelated, but ...") brings a
# new topic even when it shares words with the answer, as the next problem of a worksheet does. "Another question" and
# "one more question" are left out: users introduce follow-ups with them too.
NEW_TASK = re.compile(
    r"\W*(?:(?:ok|okay|thanks|thank you|great|cool|good|nice|alright|now|and)[,.!]?\s+)*"
    r"(?:(?:here(?:'s| is) )?(?:the |a |my )?(?:next|new|different|unrelated|separate) (?:question|problem|one|task|"
    r"exercise|topic)|(?:q|question|problem|exercise|task) ?#?\d+|(?:on )?(?:a|another) (?:different|unrelated|"
    r"separate) (?:note|topic|subject)|chang(?:ing|e of) (?:the )?(?:subject|topic)|moving on|unrelated(?: question)?)"
    r"\s*[:.!?,;-]"
)

# A sentence that states a number ("A novel has 90 pages."): a turn with two of them before its question poses a
# problem of its own, like a worksheet's next one, even on the same subject as the answer.
# Quantities a word problem states in words, and the persons a user's turn (not a word problem) speaks in.
NUMBER_WORDS = frozenset(
    {"two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve", "twenty", "thirty",
     "forty", "fifty", "hundred", "thousand", "twice", "half", "double", "triple"}
)
PERSON = frozenset({"i", "i'm", "i've", "i'd", "i'll", "me", "my", "we", "our", "us", "you", "your", "you're"})
LIST_MARKER = re.compile(r"^[ \t]*\d+[.)][ \t]", re.MULTILINE)
GIVEN = re.compile(r"(?:^|(?<=[.!?\n]))\s*(?:[^.!?\n]|\.(?=\d))*\d(?:[^.!?\n]|\.(?=\d))*\.(?=\s|$)")

# References back to the conversation, from the surest to the weakest. A request that makes one is a follow-up unless
# it brings a subject of its own, and the weaker the reference, the fewer new words that takes.
_ARTIFACT = (  # what an answer is made of, or holds
    r"answers?|responses?|reply|replies|explanations?|examples?|solutions?|code|lists?|scripts?|programs?|functions?|"
    r"methods?|approach(?:es)?|versions?|suggestions?|recommendations?|stor(?:y|ies)|poems?|essays?|articles?|"
    r"outlines?|text|tasks?|sections?|paragraphs?|sentences?|steps?|points?|options?|ideas?|ones?|tips?|strateg(?:y|"
    r"ies)|plans?|drafts?|summary|summaries|translations?|tables?|jokes?|titles?|headings?|lines?|questions?|topic|"
    r"subject|algorithm|formula|equation|calculations?|results?|output|snippet|advice|instructions?|sources?|links?|"
    r"references?|claims?|statements?|reasons?|arguments?|facts?|numbers?|names?|words?|books?|resources?|tools?"
)
_EDIT = _by_first_letter(  # verbs that rework a text that is already there
    """add remove delete drop cut change modify edit fix correct shorten lengthen expand extend simplify rephrase reword
    rewrite redo translate summarize summarise condense continue finish improve refine polish revise update adjust
    tweak convert reformat format rank sort reorder elaborate clarify comment annotate paraphrase optimize
    optimise refactor debug adapt"""
)
_MANNER = (
    r"simply|simple|clearly|clear|concise|concisely|briefly|brief|formal|formally|casual|detailed|technical|"
    r"professional|polite|serious|funny|fun|interesting|engaging|readable|natural|specific|precise|accurate"
)
# Sure: they can point nowhere else ("you said", "rewrite your explanation", "Are you sure?", "do the same for").
_SURE = (
    r"your (?:previous|earlier|last|first|second|third|above|own|original|\d+ ?(?:st|nd|rd|th))",
    r"you (?:just |have |had )?(?:(?!(?:n|f|s|sp|bl|br|proc|succ|exc|ind)eed )[a-z]+ed|said|wrote|gave|made|did|got|"
    r"put|chose|took|meant|left|found|thought|forgot|told|showed|brought|ran|set|went)",
    r"you (?:don't|didn't|did not|do not|haven't|have not|never|can't) (?:know|understand|get|answer|mention|explain|"
    r"say|provide|give|include|address|consider|account|read|see|realize|remember)",
    r"(?:why|how|where) did you|did you (?:mean|say)|(?:do|the) same (?:for|with|but|thing)",
    # "your answer" is the last one when it is reworked or judged, not when it is the next ("give your answer in ...")
    r"(?:(?:explain|rewrite|revise|change|clarify|rephrase|simplify|shorten|expand|improve|fix|correct|check|modify|"
    r"edit|update|reformulate|implement|apply|follow|use|try|about|on|from) your (?:answer|response|reply|"
    r"explanation|solution|suggestions?|approach|method|strateg(?:y|ies)|plan|code|example|list|story|poem|essay|"
    r"outline|draft)|your (?:answers?|responses?|reply|explanations?|solutions?|suggestions?|approach|methods?|"
    r"strateg(?:y|ies)|plans?|code) (?:(?:is|are|was|were) (?:wrong|incorrect|not|nothing|too|confusing|unclear|"
    r"missing|outdated|useless|bad|great|good)|isn't|aren't|wasn't|doesn't|don't|didn't|seems?|sounds?|looks?|says|"
    r"said|mentions|mentioned|changes?|would change))",
    r"are you (?:sure|certain|kidding|serious|joking)|not what i (?:asked|meant|wanted|said)|i meant|why not",
    r"(?:would|will|does|did|might|could) your [a-z]+(?: [a-z]+)? (?:change|differ|be different|still (?:hold|apply))",
)
# Strong: a demonstrative ("this algorithm", "these suggestions", "the above code"), a rework of something already
# there ("make it shorter", "translate it", "explain more simply", "in more detail"), a turn that opens with "But" or
# "And", a variant ("what about ...", "do it again"), and a challenge ("Is that true?").
_STRONG = (
    r"this (?!(?:week|weekend|year|month|morning|afternoon|evening|night|time|summer|winter|spring|fall|autumn|season|"
    r"semester|century|decade|way|kind|sort|type|is|was|will|would|can|could|should|has|does|may|might|must|one|and|"
    r"or|to|in|for|with) )[a-z]{3,}",
    rf"(?:these|those) (?:[a-z]+ )?(?:{_ARTIFACT})|(?:that|your) (?!(?:answer|response|reply) )(?:{_ARTIFACT})",
    r"(?:the|these|those|that|this) (?:above|aforementioned|previous|preceding|earlier|corresponding|mentioned|"
    r"listed|suggested) (?!(?:year|month|week|day|night|time|decade|century)s? )[a-z]+",
    r"(?:make|keep|write|rewrite|explain|say|put|phrase|describe|summari[sz]e|word|be) (?:it |this |that |them |"
    r"these |those |everything |the [a-z]+ )?(?:a (?:bit|little|lot) |much |even |slightly |way )?(?:(?:more|less)"
    rf"(?= $| (?:{_MANNER}) )|shorter|longer|simpler|easier|clearer|larger|bigger|smaller|funnier|briefer|simply|"
    r"concise|formal|casual|darker|lighter|happier|sadder|scarier|stronger|softer|warmer|friendlier|catchier|punchier|"
    r"livelier|richer|tighter|cuter)",
    r"make (?:it|this|that|them) (?:a (?:bit|little|lot) |much |even |slightly |way )?(?:more|less) [a-z]+",
    r"make (?:it|this|that|them) (?!(?:to|big|work|happen|through|out|up|home|possible|easy to|hard to)\b)[a-z]+",
    r"(?:compare|contrast|combine|merge|connect|link|relate) (?:it|this|that|them|these|those)",
    r"(?:say|write|put|phrase|word|explain|tell|ask|do) (?:it|this|that|them) (?:[a-z]{3,}ly|differently|better)",
    r"which of (?:the|these|those) (?:two|three|four|five|ones|options|choices|ideas|suggestions)",
    rf"(?:{_EDIT}|explain) (?:it|them|(?:me )?(?:the|your|this|that|these|those) (?:[a-z]+ )?(?:{_ARTIFACT}))",
    r"(?:in|into) (?:more|greater|further|much more) detail|in (?:simpler|plainer|easier|other|fewer) (?:terms|words)",
    r"(?:on|about) (?:the|this|that) (?:topic|subject|matter)(?! of )|which of (?:them|these|those)",
    r"(?<=^ )(?:but|and|or)|(?:what|how) about|what if|(?:do|try|redo|repeat) (?:it|this|that|the same(?: [a-z]+)?) "
    r"again|but this time|this time around|one more time|once more|same (?:thing|again|but|for|with)",
    # redone under a new constraint ("Now write it as a limerick", "Do it in Rust", "Make one about spring")
    r"(?:write|rewrite|do|redo|make|turn|put|present|format|give|tell|say|try|show|explain|translate|answer|draw|sing|"
    r"compose|generate|create) (?:it|this|that|them|these|those|one|another one|the same(?: [a-z]+)?|a new one|"
    r"a similar one|one more) (?:again|as|in|into|for|but|without|with|using|like|from|about|where|so|only|instead)",
    r"is (?:that|this) (?:true|right|correct|accurate|so|really)|(?:that|this|it)(?:'s| is| was) not (?:what|right|"
    r"correct|true|it)",
)
# A clipped question ("Do I have to?", "Which one?", "which is best?"), and a pronoun standing for something said
# before ("caused by this?", "Is that still a thing?", "They are too long."): these need the punctuation.
CLIPPED = re.compile(
    r"(?:have|has|want|need|supposed|going|able|ought|got) to\s*[?.!]|which (?:ones?\s*[?.!]|(?:one |ones )?(?:is|"
    r"are|would be|will be) (?:the )?(?:best|better|worse|cheaper|easier|faster|safer|cheapest|easiest|fastest|"
    r"safest)\s*[?.!,])"
)
# Found from the pronoun (a pattern that opens with letters is found fast), then checked on either side of it.
PRONOUN = re.compile(r"th(?:is|at|em|ese|ose|ey)\b")
CLAUSE_END = re.compile(r"(?: (?:too|again|out|up|in|down|instead|as well|please|anyway))?\s*(?:[?!.,;:)]|$)")
ASKED_ABOUT = re.compile(  # "Is that ...", "... and are they ...": ends right before the pronoun
    r"(?:^|[.?!;,]\s*|\b(?:and|but|so|or|then) )(?:is|are|was|were|does|do|did|can|could|will|would|should|has|have|"
    r"isn't|aren't|doesn't|don't|didn't|can't|won't|wouldn't) $"
)
SUBJECT_OF = re.compile(  # "They are ...", "That doesn't ...": right after a pronoun that opens a sentence
    r"(?:'s|'re| is| are| was| were| does| do| did| doesn't| don't| didn't| isn't| aren't| would| will| can| could| "
    r"should| seems?| sounds?| looks?| works?)\b"
)
# Not after an opening sentence of the user's own, where the pronoun stands for that ("I want to make games. What
# tools are there for that?").
OWN_SETUP = re.compile(r"\W*(?:i|i'm|i'd|i've|i'll|my|we|we're|we've|our)\b[^.?!\n]*[.!\n]")
# Then the parts of an answer a short request names ("the first one", "step 2", "the code"), words that lean on what
# came before but often do not ("it", "also", "a faster way"), and last a request to rework something that needs it to
# be there ("Can you add comments?") or a next step of the user's own ("What software should I use?").
_DEICTIC = (
    r"(?:the|your) (?:answer|response|reply|explanation|examples?|solution|code|list|script|program|function|method|"
    r"approach|version|suggestions?|story|poem|essay|article|outline|text|task|sections?|paragraphs?|sentences?|"
    r"steps?|points?|options?|ideas?|ones?|results?|outputs?|table|data|entit(?:y|ies)|items?)",
    r"the (?:first|second|third|fourth|fifth|last|previous|same|other|next|final|latter|former|\d+ ?(?:st|nd|rd|th))",
    r"(?:step|point|option|item|line|part|number|paragraph|example) \d+|above|instead|again|similar",
    r"there(?= $)",  # the turn ends on it: "Why do you compute 15 * 2 there?"
    r"(?<=^ )(?:and|but|so|then|also|now)",
)
_WEAK = (
    # not an "it" that stands for nothing: "is it possible to ...", "how long does it take", "has it been"
    r"it(?! [a-z']+ (?:to|that|if|whether) | (?:been|rains?|snows?|takes?|costs?) )",
    r"that|this|these|those|they|them|he|she|him|her|its|their|also|too|another|else|rest",
    r"(?:a|an|any|the|something) (?:faster|quicker|simpler|easier|shorter|longer|better|cheaper|cleaner|clearer|"
    r"smaller|bigger|safer|more [a-z]+)(?! than )",
)
POINTS_BACK = phrases(*_SURE)
CREATES = phrases(r"(?:write|implement|create|generate|compose|draft|build|design|develop|make) (?:me )?(?:an?|the)")
# The references a request may make when it brings at most 5, 3 or 2 new words, each found in one pass.
REFERENCE_WITHIN = {
    5: phrases(*_SURE, *_STRONG),
    3: phrases(*_SURE, *_STRONG, *_DEICTIC),
    2: phrases(*_SURE, *_STRONG, *_DEICTIC, *_WEAK),
}
LEANS_ON = re.compile(
    r"\W*(?:(?:ok|okay|now|then|and|also|great|thanks|thank you|nice|cool|perfect)[,.!]?\s+)*(?:(?:can|could|would|"
    rf"will) you (?:please |now |also |just )?|please |now |also )?(?:{_EDIT})\b"
)
NEXT_STEP = phrases(
    r"(?:should|shall) (?:i|we)|i (?:don't|do not|didn't|still don't) (?:understand|get|follow)",
    r"i(?:'m| am) (?:confused|lost)",
)
