"""The per-sentence rules of the crisis check and the modifiers that lower a hit.

Owns: ``RULES`` (category, level, name, pattern, in ``escrag.safety.lexicon``'s vocabulary) and the
modifiers (negation, a resolved past, fiction or news, jokes and hyperbole, ordinary contexts, the
sentence contexts that cap the embedding head). ``escrag.safety.turns`` runs them over every client
turn.
Levels of a rule: ``high`` (a risk now, on its own), ``elevated`` (worth a human's look) and ``cue``
(only a building block: means at hand, a time, a weapon, a symptom; a cue raises the conversation to
high only next to another cue or an ideation statement, see ``escrag.safety.turns.COMBOS``).

Every pattern was written from the category specification and the tuning set
(``data/safety/tuning.jsonl``); none comes from the evaluation set.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from escrag.safety.lexicon import (
    BLADE,
    GUN,
    HANG,
    KIN,
    MEANS,
    MEDS,
    NUMBER_BIG,
    PERSON,
    POSS,
    QUANTITY,
    SELF,
    TIMING,
    WEAPON,
    _alt,
)

# ------------------------------------------------------------------------------ rules


@dataclass(frozen=True)
class Rule:
    category: str  # suicide | self_harm | harm_to_others | abuse | medical
    level: str  # high | elevated | cue
    name: str  # what it recognises; cue names are what the combinations look for
    pattern: re.Pattern
    inner_negation: bool  # a negation inside the match lowers it ("would never take my life"); False
    # for patterns that spell out a negation themselves ("won't be here much longer")


def _r(category: str, level: str, name: str, pattern: str) -> Rule:
    return Rule(category, level, name, re.compile(pattern), not re.search(r"\bnot\b|\bnever\b|\bno\b", pattern))


_GOING = _alt("going to", "will", "shall", "plan to", "planning to", "plan on", "planning on", "intend to",
              "intending to", "decided to", "have decided to", "made up my mind to", "ready to", "about to",
              "gonna", "going to try to", "try to", "trying to")
_WISH = _alt("want to", "wants to", "wanted to", "need to", "needs to", "have to", "gotta", "got to", "would rather",
             "thinking about", "thinking of", "been thinking about", "considering", "think about", "thought about",
             "fantasi[sz]e about", "would", "could", "might", "should")
_KILLSELF = rf"(?:kill|killing|kills|killed|hang|hanging|hanged|hangs|shoot|shooting|shot|drown|drowning|off|offing|poison|poisoning|suffocate|suffocating|gas|gassing|electrocute|smother) {SELF}"
_ENDLIFE = rf"(?:end|ending|ended|ends|take|taking|took|takes) (?:{POSS} (?:own )?(?:life|lives)|{POSS} own)"
_OTHER_VERB = _alt("make (?:him|her|them|\\w+) (?:suffer|bleed|pay)", "kill", "murder", "stab", "shoot", "strangle", "choke", "beat up", "beat", "hurt", "poison",
                   "run (?:him|her|them) over", "smash", "bash", "slit", "attack", "torch", "blow up",
                   "cut", "gut", "slice", "break", "destroy", "finish", "get rid of", "end", "make (?:him|her|them) pay",
                   "batter", "shank", "knife", "strangle", "drown", "burn")
_TARGET = _alt("(?:his|her|their|my \\w+s) (?:legs?|arms?|neck|face|head|jaw|nose|skull|knees?|fingers|hands?|throat|kneecaps|teeth)",
               "the (?:girl|boy|guy|man|woman|kid|kids|teacher|people|person|one|ones) (?:who|that)",
               "(?:my|his|her|their) (?:\\w+s )?(?:new )?(?:guy|man|woman|boyfriend|girlfriend|husband|wife|partner|boss|family)",
               "him", "her", "them", "that (?:guy|man|woman|girl|boy|kid|bitch|bastard|asshole|idiot|teacher|family)",
               f"(?:my|his|her|their|that|the) {PERSON}", "those (?:guys|kids|people|idiots|bastards)",
               "everyone", "everybody", "people", "someone", "somebody", "the whole (?:class|school|office|lot)",
               "all of them", "each of them", "[a-z]+ from (?:work|school|class)")
_ABUSER = rf"(?:he|she|they|(?:my|her|his|our|your) (?:\w+s )?{PERSON}|(?:my|her|his|your) (?:ex|abuser))"
_VICTIM = rf"(?:me|us|my {KIN}|the {KIN}|her|him|them)"

RULES: list[Rule] = [
    # ---- suicide: intent, plan, method research, preparation, attempts; ideation as cues
    _r("suicide", "high", "intent", rf"\b{_GOING} (?:\w+ )?(?:{_KILLSELF}|{_ENDLIFE}|commit suicide|do it myself|overdose|take an overdose|od)\b"),
    _r("suicide", "high", "ideation_active", rf"\b{_WISH} (?:\w+ )?(?:{_KILLSELF}|{_ENDLIFE}|commit suicide|do it myself)"),
    _r("suicide", "high", "intent", r"\b(?:i|he|she|they|you)(?: am| is| are| will| have| has)?(?: finally| really| actually| just| definitely)? (?:going|planning|about|ready|determined|set|decided) (?:to )?(?:end it|end things|end everything|go through with it|do it)(?! with\b)"),
    _r("suicide", "high", "intent", r"\b(?:end|ending|finish|finishing) (?:it|things|everything|this) (?:all|for good|tonight|today|now|once and for all|forever|soon)\b"),
    _r("suicide", "high", "intent", r"\b(?:i am|im|i have|ive) (?:done|finished)\b.{0,40}\b(?:tonight|tomorrow|going to|it all|for good)"),
    _r("suicide", "high", "intent", r"\b(?:suicidal|suicide)\b.{0,40}\b(?:plan|tonight|tomorrow|ready|going to|decided|method|means|note)\b"),
    _r("suicide", "high", "ideation_active", r"\b(?:i|he|she|they|you)(?: am| is| are| have been| has been| feel| feels| felt| have| has)? (?:really |very |so |actively |seriously |extremely )?(?:suicidal|been suicidal)\b"),
    _r("suicide", "high", "ideation_active", r"\b(?:thinking|thoughts|think|thought) (?:about|of) (?:ending it(?: all)?|suicide|killing (?:my|him|her|them)self|ending (?:my|his|her|their) (?:own )?life|taking (?:my|his|her|their) (?:own )?life)"),
    _r("suicide", "high", "ideation_active", r"\bsuicidal (?:thoughts|ideation|urges|feelings)\b"),
    _r("suicide", "high", "ideation_active", r"\b(?:want|wants|wanted|ready|deserve|deserves|going|need|needs) to die\b"),
    _r("suicide", "high", "intent", r"\b(?:make|making) (?:sure|certain) (?:that )?(?:i|he|she|they) (?:never|do not|does not|will not|dont|wont) wake up"),
    _r("suicide", "high", "intent", r"\b(?:will not|wont|not going to|am not going to) (?:be (?:here|around|alive)|wake up|see|make it to|live to see) (?:much longer|for (?:much )?longer|tomorrow|by|after|next|the (?:weekend|morning|end)|christmas|new year|my birthday|the new year|another)"),
    _r("suicide", "high", "intent", r"\b(?:found|have|got|made|chose|chosen) (?:a|the|my) (?:way out|permanent solution|final solution|exit)"),
    _r("suicide", "high", "intent", r"\bpermanent solution\b"),
    _r("suicide", "high", "intent", r"(?<!hope )(?<!hopefully )(?<!think )(?<!pray )\b(?:it|everything|the pain|my pain|all of this|all this) (?:will|is going to) (?:all )?be over (?:soon|tonight|tomorrow|for good|by (?:tonight|tomorrow|the morning|morning))\b"),
    _r("suicide", "high", "intent", r"\b(?:you|they|nobody|no one|he|she|people|everyone) (?:will not|wont|do not|does not|never) (?:have to|need to) (?:worry about|deal with|put up with|see|hear from|bother with|look after|take care of) me (?:again|anymore|any more|much longer|after|soon|for long)"),
    _r("suicide", "high", "intent", r"\b(?:this is|these are) (?:my|the) (?:last|final) (?:conversation|message|words|post|night|day|goodbye|time i)"),
    _r("suicide", "high", "intent", r"\bchecking out (?:for good|permanently|early|tonight|of life)\b"),
    _r("suicide", "high", "intent", r"\b(?:join|be with|see) (?:my|her|his) (?:late |dead )?(?:wife|husband|mum|mom|mother|dad|father|son|daughter|baby|brother|sister|partner|gran|grandma|grandmother|grandpa|grandfather|nan|friend|boyfriend|girlfriend)(?: again)? (?:soon|tonight|tomorrow|this week|very soon|now)"),
    _r("suicide", "high", "intent", r"\b(?:by|after) (?:this time|tomorrow|next week|the weekend|friday|saturday|sunday|monday|tonight)\b.{0,40}\b(?:not|never|no longer|will not|wont) (?:matter|be here|be around|exist|be alive|be a problem|be a burden)"),
    _r("suicide", "high", "intent", r"\b(?:will not|wont|not) be (?:a burden|a problem|in anyones way|in the way) (?:to anyone |for anyone |to you |for much )?(?:much longer|for (?:much )?longer|soon|after (?:this|tonight|today|tomorrow))"),
    _r("suicide", "high", "intent", r"\b(?:step|stepped|jump|jumped|jumping|throw (?:my|him|her)self|go|going) (?:in front of|under) (?:a|the|an) (?:train|bus|truck|lorry|car|traffic)"),
    _r("suicide", "high", "intent", r"\b(?:going|want|wants|about|ready|planning|decided|plan) to jump(?: off| from)?(?: (?:the|a|this|that|my) (?:\w+ )?(?:bridge|roof|building|balcony|window|cliff|ledge|tower|overpass|car park|parking garage))?(?: tonight| today| tomorrow| now)?\s*$"),
    _r("suicide", "high", "intent", r"\b(?:jump|jumping|throw (?:my|him|her)self|leap) (?:off|from) (?:the|a|this|that|my) (?:\w+ )?(?:bridge|roof|building|balcony|window|cliff|ledge|tower|overpass|car park|parking garage|top floor)"),
    _r("suicide", "high", "intent", r"\b(?:drive|driving|crash|crashing|steer|steering) (?:my|the|his|her) car (?:into|off) (?:a|the) (?:wall|tree|river|lake|cliff|bridge|barrier|lorry|truck|sea|oncoming)"),
    _r("suicide", "high", "intent", r"\b(?:drive|driving) (?:off|into) (?:the|a) (?:cliff|bridge|river|lake|sea|wall)"),
    _r("suicide", "high", "plan", r"\b(?:have|got|made|making|make|working on|worked out|thought out|figured out|written|wrote) (?:a|the|my|some|out a|out the|all the) ?(?:plan|plans|details|method)\b(?! (?:for|with) (?:the|my|our|a) (?:weekend|trip|holiday|party|wedding|future|career|study|revision|exam|budget|meal|workout|day))"),
    _r("suicide", "high", "plan", r"\b(?:know|knows|figured out|worked out|decided|picked|chosen|chose) (?:exactly )?(?:how|when|where|the (?:day|date|place|time|way|method)) (?:i|he|she|they|to)\b.{0,30}\b(?:do it|end it|die|kill (?:my|him|her|them)sel(?:f|ves)|jump|end (?:my|his|her|their) life)\b"),
    _r("suicide", "high", "plan", r"\b(?:picked|chosen|chose|decided on|settled on) (?:the|a) (?:bridge|day|date|building|spot|method|place|way)\b"),
    _r("suicide", "high", "means", rf"\b(?:saving|saved|stockpiling|stockpiled|stock piled|collecting|collected|hoarding|hoarded|counting|counted|lining up|lined up|gathering|gathered|got enough|have enough|enough|stash of|stashed|hiding|hidden|squirreling|squirrelled|building up|built up|put aside|putting aside|set aside|saving up|saved up)(?: \w+){{0,4}} {MEDS}"),
    _r("suicide", "high", "means", rf"\b{MEDS}\b(?: \w+){{0,4}} (?:saved up|stockpiled|counted out|lined up|all lined up|ready|set out|laid out|sorted|in front of me|next to me|beside me|in my hand|in my hands)"),
    _r("suicide", "high", "means", r"\b(?:bought|buy|got|have|tied|tying|hung|hanging|set up|ready|found|made|making|tie) (?:a|the|some|my|up a|up the)? ?(?:rope|noose|ligature)\b(?! (?:swing|course|ladder|climbing|for (?:climbing|camping|the boat|the tent)))"),
    _r("suicide", "high", "means", r"\b(?:rope|noose|ligature)\b.{0,30}\b(?:ready|tied|hanging|set up|in the (?:garage|closet|loft|attic|basement|shed|wardrobe))"),
    _r("suicide", "high", "means", r"\b(?:in|inside) (?:my|the) car\b.{0,40}\bengine (?:is )?running\b"),
    _r("suicide", "high", "means", r"\b(?:charcoal|exhaust|hose|helium|plastic bag)\b.{0,40}\b(?:car|room|tent|garage|sealed|taped|head)\b"),
    _r("suicide", "high", "means", r"\b(?:standing|stood|sitting|sat|am|was|climbed|climbing|at|on) (?:on |at )?(?:the )?(?:edge|ledge|railing|rail|top|side) (?:of )?(?:the|a|this|my|our)? ?(?:\w+ )?(?:bridge|roof|building|cliff|platform|balcony|tower|car park|overpass|tracks)"),
    _r("suicide", "high", "means", rf"\b(?:{BLADE}|{GUN})\b.{{0,30}}\b(?:ready|loaded|in my hand|in my hands|next to me|in front of me|on my lap|against my (?:head|wrist|throat)|to my (?:wrist|throat|neck|head|arm|chest))\b"),
    _r("suicide", "high", "means", rf"\b(?:{MEANS})\b.{{0,60}}\b(?:keep|keeps|kept|been|am|was|sit|sat|sitting) (?:looking at|staring at|thinking about|holding|touching|counting|playing with) (?:them|it|the \w+)"),
    _r("suicide", "high", "means", rf"\b(?:going to|will|about to|gonna|plan to|planning to|want to|decided to|ready to)(?: \w+)? (?:take|swallow|drink|down|neck|empty) (?:all|everything|the whole|the rest|every|a whole|an entire|all of)\b(?: \w+){{0,4}} (?:{MEDS}|cabinet|cupboard|bottle|box|packet|pack|drawer|strip|them|it)\b"),
    _r("suicide", "high", "method_research", r"\b(?:lethal|fatal|deadly|toxic|overdose|killing) (?:dose|doses|amount|dosage|quantity|level|limit|threshold)\b"),
    _r("suicide", "high", "method_research", r"\bhow (?:many|much)(?: of)?(?: \w+){0,5} (?:would|will|does|do|to|it|should|could|can)\b.{0,35}\b(?:kill|die|dying|dead|fatal|lethal|deadly|wake up|stop (?:a |my |your |the |someones |his |her )?heart|overdose|enough|take to|it take|it takes|end it|do it|the job|be sure|be over)"),
    _r("suicide", "high", "method_research", rf"\bhow (?:many|much) {MEDS}\b.{{0,30}}\b(?:would|does|to)\b.{{0,20}}\b(?:take|kill|die|enough|fatal|lethal)"),
    _r("suicide", "high", "method_research", r"\bhow (?:high|tall|far|long|big|fast|quick|quickly|hard|deep|cold|steep|much force|many (?:floors|stories|storeys|metres|meters|feet|ft|m))\b.{0,60}\b(?:fall|falls|fell|jump|jumping|drop|survive|surviving|survivable|die|dying|dead|fatal|lethal|instant|instantly|sure|certain|over|kill|killed|splat|land)\b"),
    _r("suicide", "high", "method_research", r"\b(?:survive|survives|survived|surviving|survivable) (?:a|the|that|this)? ?(?:fall|jump|drop|plunge|hanging|overdose|od|shot)\b(?! (?:off|from) (?:my|his|her) (?:bike|horse|ladder|chair|bed))"),
    _r("suicide", "high", "method_research", r"\b(?:which|what) (?:bridge|building|cliff|floor|roof|tower|car park|train|station)\b.{0,40}\b(?:highest|tallest|jump|jumping|fall|high enough|tall enough|die|deadliest|no one survives|nobody survives|fatal|lethal)"),
    _r("suicide", "high", "method_research", r"\b(?:highest|tallest) (?:bridge|building|cliff|roof|tower|car park|point)\b.{0,40}\b(?:jump|fall|drop|die|near me|in (?:the|this|my) (?:city|town|area))"),
    _r("suicide", "high", "method_research", r"\bhow (?:long|quickly|fast|soon)\b.{0,60}\b(?:for good|die|dies|dying|dead|bleed out|bleeding out|drown|drowning|suffocate|suffocating|lose consciousness|pass out|stop breathing|heart to stop|be over|lose (?:con)?sciousness|unconscious|it to work|the pills to work|for (?:it|them) to kill)"),
    _r("suicide", "high", "method_research", r"\b(?:painless|painlessly|quick|quickest|easy|easiest|fastest|surest|sure|best|least painful|peaceful|most peaceful|simplest|cleanest|gentle|gentlest|reliable|guaranteed) (?:way|ways|method|methods|means) (?:to|of|for) (?:die|dying|kill|killing|end|ending|go|going|do it|doing it|suicide|commit|check out|not wake up|never wake up|disappear forever)"),
    _r("suicide", "high", "method_research", r"\b(?:is|does|do|would|will) (?:drowning|hanging|jumping|overdosing|bleeding out|suffocating|an overdose|slitting|dying|a fall|the fall|it|death by \w+) (?:painful|hurt|quick|instant|instantaneous|take long|feel like|be painful|be quick|be instant)"),
    _r("suicide", "high", "method_research", rf"\b(?:would|will|could|can|is|are) (?:this|that|it|these|those|\d+|{NUMBER_BIG}|x|enough|my \w+|the \w+|a \w+)(?: \w+){{0,4}} (?:be )?(?:enough to )?(?:kill (?:me|you|someone|a person|them|him|her)|be fatal|be lethal|be deadly|do it|stop (?:my|your|a) heart)\b(?! to)"),
    _r("suicide", "high", "method_research", r"\bcan (?:you|i|a person|someone|people|he|she) (?:die|overdose) (?:from|on|of|by)\b"),
    _r("suicide", "high", "method_research", r"\b(?:google|googled|googling|search|searched|searching|look|looked|looking|read|reading|research|researched|researching|watching videos|watched videos)\b.{0,40}\b(?:ways to die|ways to kill|how to (?:die|kill|hang|overdose|end it|tie a noose|slit)|suicide methods|methods of suicide|lethal|fatal dose|overdose amount|painless|how long it takes to die|how much it takes|how many it takes|how high|bridges? near|tallest|jump from)"),
    _r("suicide", "high", "method_research", rf"\bhow to (?:{_KILLSELF}|kill (?:my|your)self|end (?:my|your|a) life|commit suicide|tie a noose|slit (?:my|your) wrists|overdose|die painlessly|die quickly|not wake up)"),
    _r("suicide", "high", "method_research", r"\b(?:slit|slitting|cut|cutting|open|opening) (?:my|his|her|your) wrists?\b(?! (?:on|by accident|accidentally|cooking))"),
    _r("suicide", "high", "preparatory_act", r"\b(?:goodbye|farewell|suicide|final|last) (?:letters?|cards?|notes?|messages?|texts?|videos?|emails?|posts?|voice ?notes?|voicemails?)\b(?!.{0,50}\b(?:retir\w*|leaving (?:the|for|to|work|school|us)|moving (?:away|to|abroad|house)|farewell party|last day at|new job|leaving do|graduat\w*)\b)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:wrote|written|writing|left|leaving|sent|sending|recorded|recording|typed|finished) (?:\w+ ){0,2}(?:letters|notes|messages)\b.{0,30}\b(?:to (?:everyone|each|all|my (?:family|kids|children|parents|loved ones))|for (?:my|everyone|each|the) \w+ to (?:find|read)|to find|explaining|to read after|for after|for when)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:messages?|texts?|letters?|notes?|emails?|videos?|posts?|voice ?notes?|cards?) (?:saying|to say|that says|that said|to tell (?:them|everyone)) (?:goodbye|farewell|sorry and goodbye|i love them)\b|\b(?:thanking|thanked|thank) (?:them|everyone|everybody|people) for everything\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:giving|gave|give|given|handing|handed) (?:away )?(?:all |most |some )?(?:of )?(?:my|his|her|their|your) (?:things|stuff|belongings|possessions|clothes|books|games|jewellery|jewelry|records|collection|guitar|bike|car|savings|money|plants|pets?|cat|dog|stuff)\b.{0,60}\b(?:away|will not need|not going to need|wont need|no longer need|will not be needing|to people|to my friends|to everyone)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:giving|gave|give|given|got rid of|getting rid of) away (?:all |most |some )?(?:of )?(?:my|his|her|their) (?:things|stuff|belongings|possessions|clothes|books|games|jewellery|jewelry|guitar|stuff|prized|favourite|favorite|pets?|cat|dog)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:put|putting|getting|got|sorting|sorted) (?:all )?(?:my|his|her|their) affairs in order\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:after|when|once|for when|if) (?:i am|he is|she is|they are|i|he|she|im) (?:gone|dead|no longer (?:here|around|alive)|not here anymore|not (?:here|around) anymore|not around|not alive)\b(?! (?:on|for|to|away) )"),
    _r("suicide", "high", "preparatory_act", r"\b(?:after|when) (?:i|he|she|they) (?:die|dies|kill|killed|end it)\b(?! (?:of old|of age|in \d|at \d|old))"),
    _r("suicide", "high", "preparatory_act", r"\b(?:saying|said|say|texting|texted) (?:my|his|her|their) (?:final |last )?goodbyes\b|\bgoodbye to (?:everyone|everybody|all of you|the world|you all|my family|everything)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:no one|nobody|the kids|my kids|they|my family|my parents|my wife|my husband|my children|you) (?:will not|would not|do not|does not|wont|never) (?:have to|be the (?:ones?|person) to|need to) (?:find|deal with|clean up|worry about|pay for|see) (?:me|it|the mess|a mess|my|anything)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:be|being) the (?:ones?|person|first) (?:to|who) finds? me\b|\bfind (?:my body|me dead)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:plan|planned|planning|arranged|arranging|picked|chose|choosing|wrote|written) (?:out )?(?:my|his|her) (?:own )?(?:funeral|burial|eulogy|memorial)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:look after|take care of|feed|adopt|rehome|re home|find a home for|care for|raise|walk) (?:my|his|her|the) (?:cat|cats|dog|dogs|pet|pets|kids|children|son|daughter|fish|bird|rabbit|hamster|baby|plants)\b.{0,40}\b(?:after|when|once|if) (?:i|he|she) (?:am|is|im|are)? ?(?:gone|not here|not around|no longer)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:wrote down|written down|leaving|left|sorted out|gave) (?:all )?(?:my|his|her) (?:passwords|bank details|pin|pins|logins|accounts)\b.{0,40}\b(?:for|so) (?:my|his|her|the|everyone|them|they)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:updated|made|wrote|writing|finished|sorted|finalised|finalized) (?:my|his|her|a) (?:will|last will)\b.{0,60}\b(?:nobody|no one|mess|after i am gone|when i am gone|for after|before i go|before i die)\b"),
    _r("suicide", "high", "attempt", rf"\b(?:tried|attempted|try|trying|tries) (?:to )?(?:{_KILLSELF}|{_ENDLIFE}|end it|overdose|jump|suicide|commit suicide|kill (?:my|him|her)self|hang (?:my|him|her)self)\b"),
    _r("suicide", "high", "attempt", r"\b(?:suicide attempt|attempted suicide|attempt on (?:my|his|her) (?:own )?life|the (?:rope|belt|cord|noose) (?:broke|snapped)|(?:found|stopped|pulled) me (?:before|back|off|down|from|just in time)|woke up in (?:the )?(?:hospital|a and e|er|icu))"),
    _r("suicide", "high", "typo_slang", r"\bkill myself\b"),
    _r("suicide", "high", "method_research", r"\b(?:cliffs?|ledge|edge|bridge|quarry|roof|balcony|car park|overpass)\b.{0,60}\b(?:where the rocks|rocks (?:are|below)|low tide|the bottom|how far down|the drop (?:is|below)|land on|hit the (?:ground|water|rocks))\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:saying goodbye|said goodbye|say goodbye|visiting|visited|visit|seeing|saw|walking|walked)\b.{0,50}\b(?:one last time|for the (?:very )?last time)\b|\bwho gets what\b"),
    _r("suicide", "cue", "prep", r"\b(?:changed|changing|updated|updating|rewrote|made|wrote|writing) (?:my|his|her) (?:will|last will|life insurance)\b|\b(?:will not|wont|do not think i will|not going to|i will not) need (?:any of (?:it|this|them)|anything|my things|my stuff)\s*$"),
    _r("suicide", "high", "intent", r"\b(?:soon|tonight|tomorrow|this weekend)\b.{0,30}\b(?:be with|join|see) (?:my|her|his) (?:late |dead )?(?:wife|husband|mum|mom|mother|dad|father|son|daughter|baby|brother|sister|partner|gran|granny|grandma|grandmother|grandpa|grandfather|nan|nana|friend|boyfriend|girlfriend)\b|\b(?:going to|will|gonna) join (?:him|her|them) (?:tonight|tomorrow|this weekend|soon|on \w+day|next week)\b"),
    _r("suicide", "high", "method_research", r"\b(?:method|methods|way|ways)\b.{0,40}\b(?:success rate|most effective|works? best|most reliable|highest chance|guaranteed|foolproof|fail safe|failsafe|surest|never fails)\b"),
    _r("suicide", "high", "method_research", r"\b(?:overdose|overdosing|od)\b.{0,40}\b(?:actually works?|really works?|work|works|effective|liver (?:damage|failure)|survive|how long|painful|enough)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:something )?to remember me by\b|\bnote (?:saying|that says|about|with) who (?:should|will|can|is to) (?:take|look after|have|get|feed)\b|\b(?:leave|leave this|leaving this|depart|departing) (?:this )?(?:world|earth|life)\b"),
    _r("suicide", "high", "intent", r"\b(?:the )?last (?:time|message) (?:you|anyone|they|he|she|everyone|you all)(?: will| would)?(?: ever)? (?:hear|see|get) (?:from me|of me|me)\b"),
    _r("suicide", "cue", "prep", r"\b(?:paid|pay|paying|repaid) (?:back|off) (?:everyone|all (?:my|the) (?:debts|money)|everything i owe)|\breturned (?:all|everything)\b.{0,20}\bborrowed\b|\bleave (?:things|everything) (?:clean|tidy|in order|sorted|settled|straight)\b|\bwriting to (?:everyone|all the people|each of)\b"),
    _r("suicide", "cue", "plan", r"\b(?:got|have) (?:everything|what) (?:i|he|she) (?:need|needs)\s*$"),
    _r("suicide", "cue", "timing", r"\b(?:alone|by myself) (?:all weekend|all night|tonight|this weekend|for the weekend|till monday|until tomorrow)\b|\b(?:home alone|nobody is home|no one is home|no one will be (?:home|around|back))\b|\b(?:using|use|do|doing) it (?:tonight|today|tomorrow|now|this weekend)\b"),
    _r("suicide", "cue", "means", r"\b(?:have|got|found|get|getting) (?:the|a) (?:means|way)\b(?! (?:of|to (?:pay|get|cope|deal|make (?:money|ends|a living|it work)|support|earn|afford|travel|save)))|\b(?:know|have|got) (?:the )?(?:code|key|combination|keys) (?:to|for) (?:the|his|her|my dads|my \w+s)? ?(?:gun )?(?:safe|cabinet|cupboard|gun safe|locker)\b"),
    _r("suicide", "high", "intent", r"\b(?:bridge|cliff|roof|ledge|tracks|railway|river|sea|edge|quarry|top floor|overpass)\b.{0,40}\b(?:let go|step off|stepping off|let myself fall|let myself go|lean forward|fall forward|end it|not come back|never come back)\b"),
    _r("suicide", "high", "intent", r"\b(?:this|it|next week|tonight|today|tomorrow|sunday|saturday|friday) (?:will be|is|is going to be) my (?:last|final) (?:week|day|night|christmas|birthday|weekend|month|sunset|time|breath)\b(?! (?:before|at|of|in|with|on|off|here|there|as|working|in the office))"),
    _r("suicide", "high", "plan", r"(?<!is )(?<!are )(?<!was )\b(?:planning|planned|plan|plotting|rehearsing|rehearsed|practising|practicing|practiced|practised) (?:my|the) (?:exit|death|suicide|end|ending|way out|departure|last day|attempt)\b(?! (?:from|strategy|plan|interview|package|out of|of (?:the|this|my) (?:company|job|team|firm|relationship)))"),
    _r("suicide", "high", "method_research", r"\b(?:strongest|most dangerous|deadliest|most lethal|most toxic)\b.{0,40}\b(?:buy|get|pharmacy|chemist|over the counter|without a prescription|pills|medicine|drug|poison)\b"),
    _r("suicide", "high", "method_research", r"\b(?:how much weight|hold (?:my|your|a persons|someones|the) weight|strong enough to hold (?:me|a person|my weight|your weight)|take my weight)\b.{0,40}\b(?:rail|beam|door|hook|pipe|bannister|banister|ceiling|loft|branch|rod|handle|frame|fan|light fitting)\b|\b(?:rail|beam|door|hook|pipe|bannister|banister|ceiling|loft|branch|rod|handle|frame|fan|light fitting)\b.{0,40}\b(?:hold my weight|take my weight|hold (?:a person|your weight|someone))\b"),
    _r("suicide", "high", "method_research", r"\b(?:trains?|express|fast trains?|freight trains?)\b.{0,20}\b(?:do not|dont|does not|that do not|that dont) stop\b|\b(?:fast|express|freight|non stop|non stopping|through) (?:trains?|ones) (?:pass|go|come) (?:through|by|my|the)\b|\bnon ?stop(?:ping)? (?:trains?|ones)\b"),
    _r("suicide", "high", "method_research", rf"\b(?:{MEDS})\b.{{0,25}}\b(?:is|are|would be|will be|be|becomes?) (?:fatal|lethal|deadly|toxic|enough to (?:die|kill))\b|\bstop (?:your|my|his|her|a persons|someones|the) breathing\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:passwords?|pin numbers?|pins?|bank details|account details|logins?|bank card)\b.{0,40}\b(?:for|to) (?:my|his|her) (?:brother|sister|mum|mom|dad|family|wife|husband|partner|kids|children|parents|son|daughter|friend|best friend)\b|\b(?:given|gave|handed|give) (?:my|his|her) (?:\w+ )?(?:my |his |her )?(?:bank card|card and pin|pin|passwords|savings|bank details)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:playlist|songs|music|flowers|outfit|clothes|speakers?|readings?|hymns?|who (?:i want )?to speak)\b.{0,20}\b(?:for|at) (?:my|his|her) (?:funeral|memorial|wake|service|burial)\b|\b(?:my|his|her) (?:funeral|memorial)\b.{0,30}\b(?:playlist|songs|outfit|who (?:i want )?to speak|planned|arranged|sorted)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:letter|letters|note|notes|message|video)\b.{0,80}\b(?:(?:was not|is not|wasnt|isnt|was never|is never) (?:your|her|his|their|anyones) fault|for (?:her|him|them|you|my \w+) to find|to find (?:after|when|later|tomorrow))\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:take|look after|have|feed|mind|keep) (?:my|the) (?:dog|cat|kids|pets?|children|son|daughter|fish|rabbit|bird)\b.{0,40}\bif (?:anything|something) (?:happens|should happen|were to happen) to me\b"),
    _r("suicide", "high", "intent", r"\b(?:walk|walking|wade|wading|swim|swimming) (?:out )?into (?:the|a) (?:sea|ocean|river|lake|water|waves)\b(?! (?:for|to (?:cool|swim)|with))"),
    _r("suicide", "high", "means", r"\b(?:i am|im|standing|sitting|stood|sat) (?:on|at) (?:the|a|this) (?:roof|ledge|edge|bridge|railing|parapet|cliff edge|top) (?:of (?:my|the|a|this) \w+ )?(?:right now|now)\b"),
    _r("suicide", "high", "means", r"\bcharcoal\b.{0,40}\b(?:tape|bbq|barbecue|grill|car|room|tent|bathroom|windows)\b"),
    _r("suicide", "cue", "plan", r"\b(?:pick|picked|picking|set|chose|chosen|choose) (?:the|a) (?:date|day|time|place|spot)\b|\b(?:everything|it) is (?:all )?(?:arranged|sorted|set|planned|ready)\b|\b(?:does not|do not|did not|will not) know why i (?:asked|did|gave|am|said)\b"),
    _r("suicide", "cue", "prep", r"\b(?:made sure|making sure|arranged|arranging|sorted|sorting) (?:that )?(?:my|the) (?:cat|cats|dog|dogs|pets?|kids|children|plants|fish|rabbit|bird) (?:will be|is|are|gets?|get|will get) (?:looked after|taken care of|fed|cared for|rehomed|a new home)\b(?!.{0,30}\b(?:while|when i am (?:away|on holiday|travelling)|during|holiday|trip|vacation))"),
    _r("suicide", "cue", "ideation", r"\b(?:will not|wont|am not|not) (?:be )?coming (?:home|back)\b|\b(?:reached|at) the end(?: of (?:my rope|the road|my tether|the line))?\s*$|\bend of the road\b"),
    _r("suicide", "high", "intent", r"\bcheck(?:ing)? out (?:early|for good|permanently|of life|of this life|tonight)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:tell|let) (?:my|your|his|her) (?:family|mum|mom|kids|parents|wife|husband|children|son|daughter|dad|sister|brother|partner)(?: know)? (?:that )?(?:i love them|i loved them|i am sorry|how much i love)\b|\b(?:will not|wont|not) be able to (?:tell|see|say|talk|hug)\b.{0,25}\bafter (?:tonight|today|tomorrow|this|friday|the weekend)\b"),
    _r("suicide", "high", "means", r"\b(?:car|engine) (?:is )?running in (?:the|a|my) (?:closed |shut |locked )?garage\b|\b(?:closed|shut|locked) garage\b.{0,25}\b(?:car|engine) (?:running|on)\b"),
    _r("suicide", "high", "means", rf"\b(?:{MEDS})\b.{{0,40}}\b(?:taking|swallowing|take|swallow|down|downing) (?:them|it|the lot) all\b|\b(?:taking|swallowing) (?:them|it) all\b.{{0,20}}\b(?:{MEDS})\b"),
    _r("suicide", "cue", "prep", r"\b(?:write|wrote|written|writing) the (?:letters|notes|goodbyes)\b|\bcancel(?:l)?(?:ed|ing)? (?:all )?my (?:subscriptions|phone contract|contracts|accounts|gym membership|appointments)\b"),
    _r("suicide", "cue", "timing", r"\b(?:it is|its) (?:time|my time)\s*$|\bmy time (?:has come|is up)\b|\b(?:i am|i will be) (?:going|leaving|gone) (?:tonight|tomorrow|soon|this weekend)\b|\bmy plan is (?:for|to do it|on)\b"),
    _r("suicide", "high", "method_research", r"\b(?:dose|amount|how much|how many|enough)\b.{0,50}\b(?:kidneys?|liver|heart|organs?|breathing|lungs)\b.{0,25}\b(?:shut down|shuts down|fail|fails|failure|stop|stops|give out|gives out|give up|pack up)\b"),
    _r("suicide", "high", "method_research", r"\b(?:more|most|less|least) (?:reliable|effective|painless|certain|lethal|deadly|quick|foolproof|peaceful|likely to work)\b.{0,50}\b(?:pills|jumping|hanging|gun|overdose|drowning|cutting|rope|train|bridge|tablets|car|exhaust)\b|\b(?:pills|jumping|hanging|gun|overdose|drowning|rope|train|bridge)\b.{0,30}\b(?:or|vs|versus)\b.{0,30}\b(?:pills|jumping|hanging|gun|overdose|drowning|rope|train|bridge)\b.{0,50}\b(?:reliable|painless|better|works|weighing|work best|quicker|surer)"),
    _r("suicide", "high", "method_research", r"\b(?:survive|survives|survived|surviving|survivable) (?:a |the )?(?:fall|falling|jumping|jump|drop)\w* (?:from|off|out of)\b"),
    _r("suicide", "high", "means", r"\b(?:stood|standing|stand|climbed|climbing|sat|sitting|leaning) (?:on|over|at) (?:the|a|my|that) (?:railing|ledge|parapet|guard rail|barrier)\b"),
    _r("suicide", "high", "intent", r"\b(?:lake|river|bridge|sea|ocean|tracks|cliff|woods|roof|forest|mountains?|coast|quarry)\b.{0,40}\b(?:not coming back|never coming back|not come back|will not be back|for the last time|one last time|and never return)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:who|which one|sorting out who|deciding who|decided who|sorted out who|working out who)\b.{0,10}\b(?:gets|will get|should get|can have|inherits|will have|takes) (?:my|all my|all of my)\b|\b(?:gets|can have|will have|inherits) my (?:car|cat|dog|things|stuff|guitar|savings|house|flat|clothes|jewellery|jewelry)\b.{0,40}\b(?:gets|can have|will have|inherits) my\b"),
    _r("suicide", "high", "preparatory_act", r"\bso (?:they|he|she|you|everyone|my \w+) (?:will|would|can|could) (?:understand|know why)\b.{0,20}\b(?:after|when|why i did|once)\b|\b(?:understand|know) why (?:i|he|she) did (?:it|this)\b|\b(?:do not|dont|never) come looking for me\b|\bdo not try to find me\b"),
    _r("suicide", "high", "means", r"\b(?:going to|will|gonna|about to|plan to)(?: \w+)? (?:finish|down|neck|drink|take|swallow) (?:both|them all|all of (?:it|them)|the lot|everything|the whole (?:bottle|lot|packet|thing))\b"),
    _r("suicide", "high", "method_research", rf"\bhow (?:many|much) {MEDS}\b.{{0,20}}\b(?:it takes|it would take|would it take|does it take|you need|i need|it would need)\b"),
    _r("suicide", "high", "means", rf"\b(?:{MEANS})\b.{{0,50}}\b(?:would|will|is|be|it is|are|think it is|probably|might|should)? ?(?:be )?(?:enough|sufficient|do it|do the job|do the trick|finish (?:it|me))\b(?! (?:sleep|rest|money|time|for (?:my|the) (?:pain|headache|back)))"),
    _r("suicide", "high", "means", rf"\b(?:enough|sufficient)\b.{{0,30}}\b(?:{MEANS})\b.{{0,30}}\b(?:to (?:die|end|kill|do it|not wake|never wake|stop)|would|will)\b"),
    _r("suicide", "high", "method_research", r"\b(?:garage|parking structure|car park|multi storey|building|bridge|roof|rooftop|balcony|cliff|tower|overpass|floors?|storeys?|stories|levels?|window|ledge)\b.{0,50}\b(?:high enough|tall enough|far enough|the drop|how far down|far down|enough to (?:die|kill|be sure|not survive)|people do not survive|no one survives|nobody survives|not survive|survive the fall|the fall would)\b"),
    _r("suicide", "high", "method_research", r"\b(?:keep|keeps|kept|always|can not stop|been|constantly) (?:thinking|dreaming|fantasi[sz]ing|obsessing|daydreaming) about (?:the |a |that |my )?(?:train tracks|tracks|railway|train|bridge|cliff|edge|ledge|rope|noose|pills|gun|jumping|falling|drowning|hanging|overdos\w+|crashing|driving off|the river|the roof|the motorway|the highway|dying|death|not being here|ending it|my funeral)"),
    _r("suicide", "high", "method_research", r"\b(?:what happens|what would happen|how long|how quickly|is it painful|does it hurt|how much)\b.{0,40}\b(?:drink|drinks|drank|swallow|take|inhale|eat|jump|hang|cut|overdose|take too many)\b.{0,40}\b(?:antifreeze|bleach|poison|rat poison|weed killer|pills|tablets|paracetamol|tylenol|insulin|pesticide|cyanide|helium|carbon monoxide|exhaust|rope|from|off|wrists?)"),
    _r("suicide", "high", "method_research", r"\bhow (?:long|quickly|fast|soon) (?:until|till|before|does it take (?:for )?|would it take (?:for )?)(?:it|they|the pills|the tablets|that|this) (?:works?|kicks? in|takes? effect|would work|is over|is painless)\b"),
    _r("suicide", "high", "means", rf"\b(?:{MEANS})\b.{{0,60}}\b(?:count|counting|counted|line up|lining up|lined up|sort|sorting|pour|pouring|poured|stare at|staring at|stared at|hold|holding|held|looking at|look at|touching|playing with|turning over)\b (?:them|it|the \w+)(?: over| out| again| over and over| in my hand)?"),
    _r("suicide", "high", "means", rf"\b(?:counting|counted|lining up|lined up|pouring out|poured out|holding|staring at|laid out|set out)(?: out)? (?:all )?(?:my |the |her |his )?(?:{MEDS}|{GUN}|{HANG})\b"),
    _r("suicide", "high", "means", rf"\b(?:{HANG}|{GUN}|{MEDS})\b.{{0,60}}\b(?:going to|will|gonna|plan to|plans to|planning to|wants to|want to|about to|is going to) use (?:it|them)\b(?! (?:for|to (?:sleep|hunt|cook|fix|climb|tie)))"),
    _r("suicide", "high", "preparatory_act", r"\b(?:texted|messaged|posted|sent|said|wrote|called|emailed|left a voicemail|left a message|told me)\b.{0,60}\b(?:sorry for everything|i love you all|forgive me|nice knowing you|been nice knowing|take care of (?:mum|mom|dad|the kids|yourself|everyone)|thank you for everything|goodbye|this is the end|it is not your fault|i am sorry for (?:everything|being)|look after|remember me)\b.{0,80}\b(?:phone (?:is |was )?(?:off|switched off|dead|going to voicemail)|not answering|will not answer|wont answer|can not reach|no answer|not picking up|not responding|went silent|unreachable|blocked everyone|deleted (?:her|his|their) account)"),
    _r("suicide", "high", "intent", r"\b(?:go |going to go |want to go |going to )?(?:be with|join|see|meet) (?:my |her |his )?(?:late |dead )?(?:wife|husband|mum|mom|mother|dad|father|son|daughter|baby|brother|sister|partner|gran|granny|grandma|grandmother|grandpa|grandfather|nan|nana|friend|boyfriend|girlfriend|him|her|them)(?: again)?\b.{0,40}\b(?:know how|already know|soon|tonight|tomorrow|i am ready|ready to go|on the other side|in heaven)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:gave|giving|give|handed|handing|left|leaving|signed over|rehomed|rehoming)(?: away)? (?:my|our|all my|all of my) (?:\w+ ){0,2}\w+\b.{0,60}\b(?:for good|will not need|not need (?:it|them|anything)|wont need|no longer need|not going to need|not be needing|where i am going|after i am gone)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:will not|wont|do not think i will|not going to|i will not|no longer) (?:need|be needing|use|have any use for) (?:anything|it|them|any of (?:it|this|them|my \w+)|my \w+|these|those|money|my stuff|my things)\b.{0,20}\b(?:anymore|any more|where i am going|after (?:tonight|this|today|friday|tomorrow)|soon|much longer)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:letters?|notes?|messages?|cards?|videos?)\b.{0,10}\b(?:to|for) (?:each|every one|everyone|all) (?:of )?(?:my|the|them)?\b|\bexplaining why (?:i|he|she) (?:did it|had to|am doing|is doing|have to|did this|could not|will)"),
    _r("suicide", "high", "preparatory_act", r"\b(?:tying up|tied up|tie up) (?:all )?(?:my |the )?loose ends\b|\bgetting (?:all )?my (?:things|stuff|papers|paperwork|finances) in order\b"),
    _r("suicide", "cue", "timing", r"\b(?:monday|tuesday|wednesday|thursday|friday|saturday|sunday|tonight|tomorrow|the weekend|this weekend|next week|christmas|my birthday|the anniversary|new year) (?:is|will be|would be) (?:the|my) (?:day|night|end|last)\b"),
    _r("suicide", "cue", "decision", r"\b(?:i have|i|have) (?:finally )?(?:decided|made (?:up )?my (?:mind|decision)|made the decision|made a decision|made my choice|chosen)\b(?! (?:to (?:stay|study|quit|leave (?:him|her|my job|the job)|move|go back|break up|apply|get|try|change|take|start|stop (?:drinking|smoking))|on|what|which|where|about))"),
    _r("suicide", "high", "intent", r"\b(?:will not|wont|not going to|am not going to|i will not) (?:be (?:here|around|alive|living)|make it|live) (?:(?:for|by|at|on|to see|until|till|through|past|beyond) )?(?:christmas|new year|the new year|my birthday|the weekend|next week|tomorrow|friday|saturday|sunday|monday|the end of|spring|summer|much longer|long)"),
    _r("suicide", "high", "intent", r"\b(?:nobody|no one|you|they|everyone|people|my family|he|she)(?: will| would| will not| wont| does not| do not)? (?:have to|need to) (?:put up with|deal with|worry about|see|hear from|bother with|look after|take care of|carry) me\b.{0,30}\b(?:again|anymore|any more|after|soon|much longer|for long|ever)\b"),
    _r("suicide", "cue", "plan", r"\bi (?:already |now |finally )?know (?:exactly )?(?:how|where|when)(?: (?:i will|i am going to|to do it|i would|it will))?(?: do it)?\s*$|\b(?:i have|got) (?:it )?(?:all )?(?:planned|figured out|worked out|sorted)(?: out)?\s*$"),
    _r("suicide", "cue", "ideation", r"\b(?:go |going to go |want to go |going to )?(?:be with|join) (?:my |her |his )?(?:late |dead )?(?:wife|husband|mum|mom|mother|dad|father|son|daughter|baby|brother|sister|partner|gran|granny|grandma|grandmother|grandpa|grandfather|nan|nana)\b"),
    _r("suicide", "cue", "ideation", r"\b(?:had|have had) enough of (?:this )?(?:life|living|everything|it all|being alive)\b|\bready to go\s*$|\b(?:sleep|rest) (?:for a (?:very |really )?long time|forever|for good|and never wake)\b|\b(?:long|eternal|big|final|endless) sleep\b|\bi am (?:so )?done with (?:everything|life|it all|all of it|living)\b"),
    _r("suicide", "high", "preparatory_act", r"\b(?:it has been|it was|its been|been) nice knowing (?:you|y all|everyone)\b"),
    _r("suicide", "high", "means", r"\b(?:pills?|tablets?) (?:you|i|she|he) count\b|\bcount(?:ing|ed)? (?:out )?(?:the|my|your|all the|all my) (?:pills|tablets)\b"),
    _r("suicide", "cue", "ideation", r"\b(?:one less|no|not a single|no more|not one) reasons? (?:left )?(?:to stay|to live|to keep going|to be here|to go on)\b"),
    _r("suicide", "cue", "ideation", r"\b(?:think|thinking|thought|wonder|wondering|imagine|imagining|fantasi[sz]e|fantasi[sz]ing|dream|dreaming) about (?:not being (?:here|around|alive)|not existing|dying|death|being dead|disappearing|not waking up|ending it|my (?:own )?funeral|what it would be like if i (?:was not|were not|was gone|died))\b"),
    _r("suicide", "cue", "ideation", r"\b(?:being|am|feel like|feel|such|just|only) a burden\b|\bburden (?:on|to|for) (?:everyone|everybody|my|them|you|people)\b"),
    # ---- self-harm, broader
    _r("self_harm", "high", "medical_danger", r"\b(?:down to|to the|through to|through the|see|saw|seeing|showing|exposed|hit|hitting|reached) (?:the )?(?:muscle|bone|fat layer|fat|tendon|tendons|yellow layer|white layer)\b(?! (?:mass|gain|loss|pain|ache|tone|cramp))"),
    _r("self_harm", "high", "escalation", r"\b(?:cuts|cutting|burns|burning|wounds|scars|it|self harm|marks)\b.{0,30}\b(?:way |much |a lot |so much )?(?:worse|deeper|bigger|longer|more often|more frequent)\b.{0,25}\b(?:than (?:they|it|before|ever|usual|last time)|used to|than i used to|every time|each time|now)\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:can not|cannot|could not|can not get (?:it|the blood) to|will not|wont) stop (?:the )?(?:blood|bleeding)\b|\bcut open (?:really |so |very )?(?:badly|bad|deep|wide)\b|\b(?:deep|open|gaping) (?:gash|wound|cut)\b.{0,40}\b(?:bleeding|can not close|will not close|blood)\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:punch\w*|hit\w*|slam\w*|bang\w*|smash\w*) (?:the |a |my )?(?:walls?|doors?|mirror|window|head)\b.{0,30}\b(?:until|till|so hard)\b.{0,25}\b(?:break|broke|broken|bleed|bleeds|bled|bleeding|crack|cracked|swell|swollen|black out|pass out|numb)\b"),
    _r("self_harm", "high", "escalation", r"\b(?:swallow|swallowing|swallowed|swallows)(?: \w+){0,3} (?:pins|needles|batteries|glass|razors?|blades|nails|screws|objects|things|tacks|paper clips)\b"),
    _r("self_harm", "high", "medical_danger", r"\bhit an? (?:vein|artery)\b|\bblood (?:is |was )?(?:spurting|pumping|gushing|pouring|squirting)\b|\b(?:spurting|gushing|pouring) (?:out )?blood\b|\b(?:a lot|lots|so much|loads|tons|puddle|pool) of blood\b|\bblood (?:under|on|all over|across) the (?:door|floor|carpet|sink|bath|bed|sheets)\b|\b(?:need|needs|should go to|have to go to) (?:a |the )?(?:hospital|a and e|er|emergency room)\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:big|huge|large|giant|massive) blisters?\b|\bskin (?:is )?(?:coming|peeling|falling|sliding|hanging) off\b"),
    _r("self_harm", "high", "intent_now", r"\b(?:going to|about to|gonna|will) (?:cut|burn|hurt myself|harm myself) (?:tonight|as soon as|when|once|again tonight|right now|now)\b|\b(?:cutting|burning|hurting|harming) (?:my|him|her|them|your)sel(?:f|ves) (?:right now|now|at the moment)\b"),
    _r("self_harm", "cue", "escalation", r"\b(?:needing|need) more each time\b|\bmore each time\b|\bdeeper (?:every|each) (?:time|night|day)\b|\b(?:deeper|longer|bigger),? (?:deeper|longer|bigger)\b"),
    _r("self_harm", "cue", "act", r"\b(?:razor|blade|blades|knife|lighter|scissors)\b.{0,20}\b(?:hidden|hid|hide|hiding|stashed)\b|\b(?:hidden|hid|stashed) (?:a |my |the )?(?:razor|blade|blades|knife|lighter)\b"),
    _r("self_harm", "cue", "escalation", r"\b(?:at first|first it was|started with|began with|it started as)\b.{0,50}\b(?:then|now)\b|\b(?:want|need|going|have) to (?:go|cut|push|press) deeper\b|\bneed (?:more|ten|\w+ more|\d+|deeper|bigger|more of them)(?: cuts| burns)? to feel (?:anything|something|it|better)\b|\bnow (?:i|you) need (?:the|a) (?:big|bigger|kitchen|sharper)\b"),
    _r("self_harm", "cue", "escalation", r"\b(?:worse than (?:before|ever|last time|usual)|every (?:day|night|hour|single day)|daily now|several times a day|multiple times a day|twice a day|every few hours|instead of (?:a|the|my) \w+|more and more often|bigger and deeper|deeper and deeper)\b"),
    _r("self_harm", "cue", "act", r"\b(?:digging|dig|dug|pressing|pressed|scraping|scraped|dragging|dragged) (?:it |them )?(?:into|in|across|along|over) (?:my|your|his|her) (?:arm|arms|skin|wrist|wrists|leg|legs|thigh|thighs|stomach)\b|(?<!pay )(?<!budget )(?<!hair )(?<!job )(?<!price )(?<!tax )(?<!power )(?<!funding )(?<!short )\b(?:one|a|the|my|new|fresh|more|ten|\d+|bigger|deeper|longer) cuts?\b"),
    _r("self_harm", "cue", "act", r"\b(?:using|use|used|with|switched to|started using) (?:a|the|my) (?:knife|razor|blade|lighter|pin|needle|scissors|glass|compass|pencil sharpener blade)\b"),
    _r("self_harm", "cue", "act", r"\b(?:press|pressing|pressed|hold|holding|held|put|putting|touch|touching) (?:the |a |my |lit )?(?:lighter|lit cigarette|cigarette|iron|curling iron|straightener|flame|match|hot \w+|blade|razor|knife|scissors) (?:to|on|against|into|across) (?:my|your|his|her) (?:skin|arm|wrist|leg|thigh|hand|stomach|chest)\b|\bon purpose\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:cut|cuts|wound|wounds|burn|burns|gash|gashes|scab|scabs)\b.{0,60}\b(?:red and hot|hot and red|red and swollen|swollen and red|hot to the touch|running a fever|has a fever|got a fever|fever|feverish|smells|red lines|red streaks|green|yellow pus)\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:bleeding|bled) (?:through|all over) (?:\w+ ){0,3}(?:towels?|bandages?|sheets?|plasters?|my clothes|the bed|gauze)\b|\b(?:white|leathery|charred|black|waxy|numb)\b.{0,20}\b(?:burn|skin)\b|\bskin\b.{0,20}\b(?:white and leathery|leathery|charred|waxy)\b|\bcan not feel it\b.{0,30}\bburn|\bburn\w*\b.{0,60}\bcan not feel (?:it|anything)\b"),
    _r("self_harm", "high", "intent_now", r"\b(?:locked|locking) (?:myself|herself|himself) in\b.{0,40}\b(?:razor|blade|knife|lighter|scissors|glass|pills)\b|\b(?:razor|blade|knife|lighter|scissors)\b.{0,40}\b(?:about to|going to|gonna) (?:do it|cut|start|use it)\b"),
    # ---- harm to others, broader
    _r("harm_to_others", "high", "intent_target", r"\b(?:getting|get|gets|will get|going to get|see|meet|meeting|taste) what is in my (?:glovebox|glove box|trunk|boot|bag|pocket|waistband|backpack|drawer|car|jacket|safe)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:going to|will|gonna|about to|plan to|planning to|decided to|ready to|swear i will|i am going to)(?: \w+){{1,8}}? (?:and )?(?:{_OTHER_VERB}) {_TARGET}\b(?! (?:up|at (?:chess|cards|games?|tennis|poker|pool|darts|golf)))"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:pills|poison|powder|rat poison|antifreeze|bleach|ground up|crushed up|crushed|cyanide|arsenic|drops|eye drops|laxatives|something)\b.{0,60}\b(?:going in|go in|goes in|go into|going into|into|in|slip into|mix into|put in) (?:his|her|their|the|my \w+s|my \w+) (?:shampoo|toothpaste|inhaler|food|drink|coffee|tea|dinner|lunch|breakfast|meal|water|wine|beer|soup|juice|bottle|smoothie|medicine)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:i|i keep|i kept|i have been|i was|i am)\b.{{0,20}}\b(?:pillow|hand|hands|blanket|bag|plastic bag|towel) (?:over|on|against) (?:my|the|our|his|her) (?:{KIN}|babys|sons|daughters|childs|kids|toddlers)(?:s)? (?:face|mouth|nose|head)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:hold|holding|held|push|pushing|pushed) (?:my|the|our) (?:{KIN}|baby|child) (?:under|underwater|under the water|down)\b"),
    # ---- abuse, broader
    _r("abuse", "high", "weapon", rf"\b{_ABUSER}(?: \w+){{0,3}} (?:keeps|has|leaves|shows|showed|cleans|cleaned|points|pointed|waves|waved|puts|put|sets|set|loads|loaded|sharpens|sharpened)(?: \w+){{0,3}} {WEAPON}\b.{{0,60}}\b(?:tells me|told me|says|said|reminds me|reminded me|warns me|warned me|whenever (?:i|we)|when (?:i|we)|if (?:i|we)|at me|looking at me|to scare|staring at me|remember)"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:scream\w*|yell\w*|shout\w*|text\w*|say|says|saying|said|tell|tells|telling|told|threat\w*|swear\w*|swore|warn\w*|promis\w*|vow\w*)\b.{0,40}\b(?:kill|murder|end|finish|bury|strangle|shoot|stab) (?:me|us|the kids|her|my \w+|our \w+|you)\b"),
    _r("abuse", "cue", "danger", r"\b(?:hiding|hid|locked myself|barricaded|hide) (?:in|from|under|inside|behind)\b|\b(?:banging|kicking|pounding|smashing|breaking) (?:on |down )?(?:the |my )?(?:door|window)\b|\bwill not let (?:me|her|him|us) (?:leave|go|out)\b"),
    _r("abuse", "high", "physical_now", rf"\b{_ABUSER}(?: \w+){{0,4}} (?:hit|beat|punched|kicked|slapped|attacked|battered|burned|whipped|dragged|threw|shoved|pushed|stomped on|beat up|hurt|bit|smashed|slammed|strangled|choked|is kicking|is hitting|is punching|is beating|keeps hitting|keeps kicking|keeps punching)\b.{{0,40}}\b(?:so bad|so hard|badly|black and blue|bruises|bruised|bleeding|can not see|broke|broken|unconscious|knocked out|last week|pregnant|stomach|in the face|in the head|with a|stairs|hospital|stitches|every day|every night|this month|\w+ times|again)\b"),
    _r("abuse", "high", "physical_now", r"\b(?:smash\w*|slam\w*|bang\w*|bash\w*|hit|hits|hitting|threw|throws|throwing|shoved|pushed|pushes) (?:my|her|his|your|me|her|him)(?: \w+)? (?:head|face|body)? ?(?:into|against|through|down|off) (?:the |a )?(?:wall|door|car door|floor|table|window|stairs|counter|mirror|ground)"),
    _r("abuse", "high", "child_danger", rf"\b{_ABUSER}(?: \w+){{0,3}} (?:throws|threw|slams|slammed|shakes|shook|drags|dragged|chokes|choked|kicks|kicked|hits|hit|beats|beat|burns|burned|punches|punched|locks|locked|starves|starved) (?:my|the|our|his|her|their) (?:{KIN}|little \w+|baby \w+)\b"),
    _r("abuse", "high", "sexual_violence", r"\b(?:comes|coming|came|keeps coming|kept coming|sneaks|sneaking|snuck|gets|climbs) (?:into|in to|in) (?:my|her|his) (?:room|bed|bedroom)\b.{0,40}\b(?:at night|night|when|while|and|can not stop|touches|touch)\b"),
    # ---- medical, broader
    _r("medical", "high", "poisoning", r"\b(?:swallowed|swallow|ate|eaten|eating|chewed|put in (?:his|her) mouth)(?: \w+){0,3} (?:a |some |the |two |three )?(?:button )?(?:batter(?:y|ies)|magnets?|laundry pods?|dishwasher (?:tablets?|pods?)|tide pods?|e cig liquid|vape (?:juice|liquid)|nicotine (?:liquid|juice)|cigarettes?|bleach|detergent|pesticide|rat poison|weed killer|antifreeze|mushrooms|berries|cleaning product)\b"),
    _r("medical", "cue", "intox", r"\b(?:snorted|snorting|injected|injecting|shot up|smoked|took|dropped|popped|mixed|mixing|mix)\b.{0,20}\b(?:something|some pills|a pill|pills|acid|molly|mdma|lines?|heroin|coke|crack|meth|fentanyl|ketamine|benzos?|xanax|the benzos|the pills)\b"),
    _r("medical", "cue", "intox", r"\b(?:done|did|doing|taken|took|snorted|had|racked up|cut up) (?:like |about |around |maybe )?(?:\w+ )?lines\b|\b(?:lines|bumps) of (?:coke|cocaine|ket|ketamine|meth|speed)\b"),
    _r("medical", "cue", "symptom", r"\b(?:burning up|not making sense|talking nonsense|delirious|hallucinating|overheating|really hot|boiling hot|can not stay awake|can not keep (?:my|her|his) eyes open|skin is (?:grey|gray|clammy|cold))\b"),
    _r("medical", "cue", "symptom", r"\b(?:will not|wont|not|can not|cannot|does not|doesnt) (?:respond|responding|react|reacting|wake|waking)\b|\b(?:shaking|trembling|twitching|jerking|convulsing|seizing)\b|\bcan not feel (?:your|my|his|her) (?:legs|arms|hands|feet|face|body|fingers|toes|lips)\b|\b(?:room|world|everything|vision) (?:goes|went|is going|going) (?:dark|black|blurry)\b"),
    _r("medical", "high", "symptoms", r"\bchest\b.{0,40}\b(?:elephant|crushing|crushed|pressure|squeezing|squeezed|tight|heavy|vice)\b.{0,60}\b(?:arm|jaw|breath|breathe|sweat|sweating|tingling|numb|left)\b|\b(?:left arm|my arm|my jaw|jaw)\b.{0,30}\b(?:tingling|numb|pain|hurts|aching)\b.{0,40}\bchest\b"),

    _r("suicide", "high", "typo_slang", rf"\bend (?:{POSS}) (?:own )?life\b"),
    _r("suicide", "cue", "ideation", r"\b(?:wish|wishing|wished|hope|hoping) (?:i|he|she) (?:was|were|could be|would be|d be) (?:dead|gone|never born|not here|not alive)|\b(?:wish|wishing|wished|hope|hoping) (?:i|he|she) (?:could|would|will|wouldnt|would not|do not|dont|did not|didnt) (?:just )?(?:die|disappear|not wake up|never wake up|sleep forever|stop existing|wake up)"),
    _r("suicide", "cue", "ideation", r"\b(?:do not|dont|did not|no longer|not) (?:want|wanna|wish) to (?:be here|be alive|live|exist|wake up|go on|keep going|carry on|be around|continue|be on this earth|see tomorrow)"),
    _r("suicide", "cue", "ideation", r"\b(?:better off|be better|happier|easier) (?:dead|without me|if i (?:was|were|wasnt|was not|were not|weren) (?:gone|dead|here|around|not here|not around|never born))|\bbetter off (?:if i|without|with me gone|with me dead)"),
    _r("suicide", "cue", "ideation", r"\b(?:no|not any|no real) (?:point|reason|purpose) (?:in |to |of )?(?:living|going on|being alive|life|anything|carrying on|trying|being here|existing|keep going|to live|in staying)|\bwhat is the point (?:of|in) (?:living|life|going on|anything|me|being here)"),
    _r("suicide", "cue", "ideation", r"\b(?:tired|sick|done) (?:of|with) (?:living|life|being alive|existing|everything|it all|this life)\b|\bcan not (?:go on|do this|keep going|take it|carry on|cope)(?: anymore| any more| much longer)?\b"),
    _r("suicide", "cue", "ideation", r"\b(?:want|need|wish|just want) (?:the|this|my|all the|all this|it) (?:pain )?(?:to )?(?:stop|end|be over)\b|\b(?:make|making) (?:it|this|all (?:of )?(?:this|it)|the pain|everything|everything else|it all) stop\b"),
    _r("suicide", "cue", "ideation", r"\b(?:sleep|go to sleep|fall asleep|close my eyes)(?: \w+){0,2} (?:never|not) (?:have to |need to )?wake up\b|\b(?:disappear|vanish) (?:forever|for good|permanently)\b|\bstop existing\b|\bnot (?:be|being) here anymore\b"),
    _r("suicide", "cue", "ideation", r"\b(?:i am|i feel like|feel like) (?:such )?a burden\b|\bburden (?:on|to) (?:everyone|my|them|you)\b|\b(?:no one|nobody) (?:would|will|does|is going to)(?: even| really| ever)? (?:miss|notice|care)|\b(?:will not|wont|not) be (?:anyones|a|your|their|everyones|anybodys) (?:problem|burden|issue|worry) (?:much longer|for long|soon|anymore|any more|after)\b|\bsoon i (?:will not|wont) be (?:anyones|a|your|their|everyones) (?:problem|burden)|\bsomewhere (?:no one|nobody) can (?:follow|find|reach)|\b(?:a )?better place\b|\b(?:said|say) (?:everything|all) (?:i|that i) (?:needed|wanted|had|need|want) to say\b|\bmade (?:my )?peace with (?:it|dying|everything|my decision)\b"),
    _r("suicide", "cue", "ideation", r"\b(?:suicide|suicidal|end it all|end my life|kill myself|want to die|wanna die|wish i was dead|dead inside|hopeless|no way out|trapped|no future|give up on life|giving up on life|ending it)\b"),
    _r("suicide", "cue", "timing", rf"\b(?:do it|doing it|end it|ending it|go through with it|it will be|it will happen|it is happening|that is when|the day|make my move|it is going to be|i will be gone|be gone|be over)\b.{{0,30}}\b{TIMING}\b"),
    _r("suicide", "cue", "timing", rf"\b{TIMING}\b.{{0,20}}\b(?:i am|i will be|i am going to be) (?:done|finished|gone|out)\s*$"),
    _r("suicide", "cue", "timing", rf"\b{TIMING}\b.{{0,20}}\b(?:is the night|is the day|is when|i will do it|i am doing it|i do it|it ends|it will end|i am going|i go)\b"),
    _r("suicide", "cue", "means", rf"\b(?:have|got|there is|there are|keep|kept|found|bought|buy|get|getting|access to|know where|took|steal|stole|nicked|grab|grabbed)(?: \w+){{0,3}} (?:a|the|some|my|his|her|dad'?s|dads|mum'?s|mums|moms|mom'?s|a whole|whole|all the|enough|loads of|a bottle of|a box of|a packet of|boxes of|bottles of)? ?(?:\w+ )?(?:{MEDS}|{HANG}|{GUN}|{BLADE}|charcoal|bleach|antifreeze)\b(?! for (?:my|the|his|her) (?:depression|anxiety|headache|pain|back|migraine|condition|blood pressure|diabetes|asthma|allergies|cold|flu|hunting|work|cooking|kitchen))"),
    _r("suicide", "cue", "means", r"\b(?:have|got|there is|there are|keep|kept|found|bought|access to|stash|box of|bottle of|packet of)\b.{0,40}\b(?:sleeping pills|sleeping tablets|painkillers|oxy\w*|opioids|insulin|rifle|shotgun|pistol|handgun|noose|rope)\b"),
    _r("suicide", "cue", "means", rf"\b(?:{MEDS}|{GUN}|{HANG})\b.{{0,25}}\b(?:in (?:my|the|his|her) (?:drawer|closet|cupboard|cabinet|bag|house|room|car|garage|safe|wardrobe|nightstand|bedside)|at home|in the house|under (?:my|the) bed)"),
    # ---- self-harm: escalation, medical danger, intent now; current acts and urges as cues
    _r("self_harm", "cue", "act", rf"\b(?:cut|cutting|cuts|burn|burning|burned|burnt|hurt|hurting|harm|harming|scratch|scratching|hit|hitting|punch|punching|bang|banging|bite|biting|carve|carving|stab|stabbing|bruise|bruising|starve|starving|scald|scalding) {SELF}\b"),
    _r("self_harm", "cue", "act", r"\b(?:self harm|self injury|self injure|self injuring|cutting|razor|blade|blades|lighter|safety pin)\b"),
    _r("self_harm", "cue", "act", rf"\b(?:cut|cutting|cuts|carve|carving|carved|burn|burning|burned|burnt|slice|slicing|sliced|scratch|scratching|scratched)(?: \w+){{0,2}} (?:{POSS} |into |on |across )?(?:my |his |her |your )?(?:arms?|wrists?|legs?|thighs?|skin|stomach|hips?|hands?|fingers?|ankles?|chest|body|forearms?)"),
    _r("self_harm", "high", "escalation", r"\b(?:cut|cutting|cuts|burn|burning|hurt|hurting|slice|slicing|scratching|scratch|harm|harming|blade|razor)\b.{0,40}\b(?:deeper|more often|more and more|way deeper|too deep|so deep|really deep|deeper than|harder|worse and worse|more than ever|every (?:day|night|hour)|several times a day|many times a day|multiple times a day|twice a day|each day|every single day|longer cuts|bigger|more dangerous|more seriously|too far)\b|\b(?:went|gone|go|going) (?:too|so|way|really|much) deep\b"),
    _r("self_harm", "high", "escalation", r"\b(?:switch|switches|switched|switching|move on|moved on|moving on|upgraded|graduated|escalated|escalating|progressed) (?:from (?:\w+ ){1,4})?to (?:a |the |using |burning|cutting|razors?|blades?|knives|a knife|a lighter|deeper)"),
    _r("self_harm", "high", "escalation", r"\b(?:started|starting|begun|began|now) (?:using|burning|cutting|with) (?:a |the )?(?:razor|blade|knife|lighter|iron|cigarettes?|matches|scissors|glass|myself)\b.{0,40}\b(?:because|since|instead|anymore|any more|does not|doesnt|not enough)"),
    _r("self_harm", "high", "escalation", r"\b(?:can not|cannot|cant) stop (?:cutting|burning|hurting myself|harming myself|doing it)\b|\b(?:cutting|burning|hurting myself|harming myself|self harm)\b.{0,30}\b(?:getting worse|out of control|escalat)"),
    _r("self_harm", "high", "escalation", r"\b(?:hit|hitting|bang|banging|slam|slamming)(?: \w+){0,2} (?:my|his|her) head\b.{0,40}\b(?:until|till|black out|blacked out|pass out|passed out|bleed|bleeds|bleeding|concussion)"),
    _r("self_harm", "high", "escalation", r"\bgo(?:ne|ing)? too far\b.{0,30}\b(?:blade|razor|cut|cutting|knife|burn|lighter)|\b(?:blade|razor|cut|cutting|knife|burn|lighter)\b.{0,30}\bwent too far\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:will not|does not|wont|doesnt|would not|cannot|can not|is not going to) stop bleeding\b|\bkeeps? (?:on )?bleeding\b|\bstill bleeding\b|\bbleeding (?:a lot|heavily|badly|through|everywhere|so much|really bad|profusely|like crazy)\b|\bblood (?:everywhere|all over|is pouring|keeps coming|soaking|soaked)\b|\b(?:lost|losing) (?:a lot|so much|too much) (?:of )?blood\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:need|needs|needed|might need|probably needs?|should get|think it needs|could need|require|requires) (?:some )?(?:stitches|stiches|sutures|medical attention|a doctor)\b|\bgaping\b|\bsee (?:the )?(?:fat|bone|white (?:layer|stuff|tissue)|tendon|muscle|yellow (?:layer|stuff))\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:cut|cuts|wound|wounds|burn|burns|burned|burnt|burning|scald\w*|gash|gashes|scab|scabs|blister|blisters|arm|forearm|wrist|thigh|leg|skin)\b.{0,60}\b(?:infected|infection|pus|oozing|swollen|red streaks|hot to the touch|fever|feverish|blistering|blistered|charred|black|peeling|white and|keeps reopening|reopened|wont close|will not close|does not close|(?:yellow|green|white|smelly) (?:stuff|gunk|goo|liquid|fluid)|coming out of it)\b"),
    _r("self_harm", "high", "medical_danger", r"\bbleeding (?:for (?:an hour|hours|\w+ hours|\d+ minutes|\w+ minutes|ages|a long time|so long)|since (?:last night|this morning|yesterday))\b|\b(?:bleeding|blood|cut)\b.{0,50}\b(?:lightheaded|light headed|feel faint|feeling faint|dizzy|passing out|going to pass out|room is spinning)\b|\b(?:towel|towels|bandage|bandages|sheets?|shirt|clothes|sleeve|gauze|tissues)\b.{0,15}\b(?:is |are |was |were )?(?:soaked|drenched|full of blood|covered in blood)\b"),
    _r("self_harm", "high", "medical_danger", r"\b(?:sliced|cut|split|ripped|torn|tore) (?:my|his|her|your) (?:\w+ )?open\b|\bcan see (?:inside|into it|the inside|right in)\b"),
    _r("self_harm", "cue", "urge_now", r"\b(?:want|need|have) to (?:cut|burn|hurt|harm|hit|punch|slam|scratch|carve)(?: \w+)?(?: \w+)? (?:right now|now|so badly|so bad)\b"),
    _r("self_harm", "cue", "act", r"\b(?:heating|heat|heated|heating up|warming) (?:up )?(?:the|a|my) (?:knife|blade|metal|spoon|lighter|iron|coin|key)\b"),
    _r("self_harm", "high", "intent_now", rf"\b(?:going to|about to|will|gonna|ready to)(?: \w+)? (?:cut|burn|hurt|harm|hit|slam|punch|scratch|carve|slice|stab|scald|bruise) (?:{SELF}|{POSS} (?:arms?|wrists?|legs?|thighs?|skin|hands?|head|body|stomach))\b.{{0,40}}\b(?:now|right now|tonight|as soon as|when i get home|cannot hold|can not hold|again|today|in a minute)\b|\b(?:as soon as|when|once) (?:i get home|everyone is asleep|they leave|i am alone)\b.{{0,20}}\b(?:cut|burn|hurt myself|harm myself)\b"),
    _r("self_harm", "high", "intent_now", rf"\b(?:{BLADE}|lighter|scissors|glass|safety pin|needle)\b.{{0,25}}\b(?:in my hand|in my hands|ready|right here|next to me|on my (?:arm|wrist|skin|leg))\b"),
    _r("self_harm", "high", "intent_now", r"\b(?:going to|about to|gonna|will) cut (?:again )?(?:now|right now|tonight|again)?\s*$"),
    # ---- harm to others: intent with means or a target; weapons, venting and targets as cues
    _r("harm_to_others", "high", "intent_target", rf"\b(?:going to|will|gonna|shall|about to|plan to|planning to|planning on|decided to|ready to|intend to|am going to|is going to|are going to|swear i will|swear i am going to|i will|i am going to)(?: \w+)? {_OTHER_VERB} {_TARGET}\b(?! (?:at|in) (?:chess|cards|a game|games|tennis|poker|fifa|football|soccer|the race|pool|darts|golf|scrabble|monopoly))"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:bring|bringing|take|taking|carry|carrying)(?: \w+){{0,2}} {WEAPON} (?:to|into|in to) (?:school|work|class|the office|college|uni|the party|church|the mall|his|her|their|the meeting|campus)"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:shoot|shooting|blow|blowing|bomb|bombing) up (?:the|my|a|our|his|her) (?:school|office|work|workplace|place|class|church|mall|party|building|college|campus)"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:put|putting|slip|slipping|add|adding|mix|mixing|spike|spiking)(?: \w+){0,3} (?:poison|rat poison|antifreeze|bleach|pills|something|drugs|cyanide|arsenic)\b.{0,80}\b(?:shampoo|toothpaste|inhaler|food|drink|coffee|tea|dinner|lunch|meal|water|wine|beer|medicine|bottle)"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:burn|burning|set fire to|torch|torching) (?:his|her|their|the|my \w+s) (?:house|home|car|flat|apartment|place)\b.{0,20}\b(?:down|with (?:him|her|them) in it|while)"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:they|he|she|all of them|everyone|those \w+)(?: will|are going to|is going to|are gonna) (?:all )?(?:pay|regret it|be sorry|get what is coming)\b.{0,40}\b(?:tomorrow|tonight|monday|friday|soon|gun|knife|school|work|when i)"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:use|using) (?:it|the {WEAPON}|my {WEAPON}|this {WEAPON}) on (?:him|her|them|my|his|that|those|the|anyone|everyone|someone)\b"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:shook|shake|shaking|shaken|smother|smothered|smothering|suffocate|suffocated|drop|dropped|throw|threw|hit|hitting) (?:the|my|our) (?:baby|newborn|infant)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:scared|afraid|terrified|worried) (?:that )?i (?:am going to|will|might|could|would) (?:hurt|kill|harm|shake|smother|drown|hit|strangle) (?:my|the|our) {KIN}"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:waiting|wait|hiding|parked) (?:outside|for|near|by|at|in) (?:his|her|their|my|the|him|her)\b.{{0,50}}\b{WEAPON}\b|\b{WEAPON}\b.{{0,50}}\bwaiting (?:outside|for|near|by|at) (?:his|her|their|him|them)"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:i have|i got|got|have|bought|brought|carrying|holding|with)(?: \w+){{0,3}} {WEAPON}\b.{{0,60}}\b(?:when (?:he|she|they)|for (?:him|her|them)|going to (?:use|get|hurt|kill|stab|shoot)|make (?:him|her|them) pay|teach (?:him|her|them)|he will|she will|they will|tonight|tomorrow)"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:kill|murder|stab|shoot|strangle) (?:my|his|her|the) {PERSON}\b.{{0,40}}\b(?:tonight|tomorrow|when|i know|plan|the day|friday|monday|weekend|alone)\b"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:smash|bash|cave|kick) (?:his|her|their) (?:head|skull|face) in\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:going to|will|gonna|about to|plan to|planning to|decided to|want to) (?:run|mow) (?:{_TARGET}|\w+) (?:\w+ )?(?:over|down)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:sharpen|sharpened|sharpening|load|loaded|loading|clean|cleaned|cleaning|oiling|hiding|hid)\b.{{0,30}}\b{WEAPON}\b.{{0,40}}\b(?:thinking about|for|waiting for|ready for|planning|meant for|with .{{0,10}} name on it) (?:him|her|them|my {PERSON}|the {PERSON}|that \w+|those \w+)"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:standing|stood|waiting|sitting|hiding|crouching|parked) (?:\w+ ){{0,4}}(?:his|her|their|the \w+s) (?:kitchen|house|room|bedroom|door|doorstep|garden|driveway|car|office|flat|apartment|window|porch|school|work) with (?:a|the|my|his) {WEAPON}"),
    _r("harm_to_others", "high", "threat", rf"\b(?:i mean it|i am (?:not joking|serious|dead serious)|not kidding|not joking|i swear|i promise|meant every word|i will do it)\b.{{0,80}}\b{_OTHER_VERB} {_TARGET}\b|\b{_OTHER_VERB} {_TARGET}\b.{{0,60}}\b(?:i mean it|not joking|dead serious|i am serious|not kidding|meant every word|i swear)"),
    _r("harm_to_others", "high", "threat", rf"\b(?:told|threatened|warned|promised) (?:him|her|them|my {PERSON})\b.{{0,20}}\b(?:i will|i would|i am going to)\b.{{0,20}}\b(?:kill|burn|stab|shoot|hurt|end)\b.{{0,60}}\b(?:meant|mean|serious|will do it|every word)"),
    _r("harm_to_others", "cue", "weapon", rf"\b{WEAPON}\b.{{0,30}}\b(?:in my (?:hand|hands|pocket|bag|backpack|car|glovebox|glove box|jacket|coat|waistband|room|locker|desk|boot|trunk|lap)|loaded|sharpened|sharpening|ready|next to me|under my (?:pillow|bed|seat)|by the door|with me|in the glovebox|in the glove box|in the car|in my truck)"),
    _r("harm_to_others", "cue", "weapon", rf"\b(?:sharpen|sharpened|sharpening|loaded|loading|load|bought|buying|got|have|has|carrying|hidden|hid|keep|stashed|oiled|cleaned|took|grabbed|taken|stole|packed)(?: \w+){{0,3}} {WEAPON}\b(?! for (?:hunting|cooking|the kitchen|work|protection from (?:bears|animals)))"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:fertili[sz]er|ammonium nitrate|gunpowder|detonators?|pressure cooker|pipe bombs?|nails and (?:wire|a timer))\b.{0,60}\b(?:watching|scoping|casing|planning|target|mosque|church|synagogue|temple|school|market|crowd|concert|parade|office|station)\b"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:make|making|made|build|building|built|assemble|assembling) (?:a|an|some|my|the) (?:bomb|bombs|explosive|explosives|pipe bomb|ied|molotov)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:outside|at|in|near|behind|by) (?:his|her|their|the|my \w+s|my) (?:\w+ )?(?:house|flat|door|work|school|office|place|home|apartment|car|window|building)\b.{{0,25}}\b(?:with|holding|carrying|and) (?:a|the|my|his|her) {WEAPON}\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b{WEAPON}\b.{{0,60}}\b(?:parked|waiting|sitting|standing|hiding|outside|at) (?:outside |near |by )?(?:his|her|their|my|the) (?:\w+ ){{0,4}}(?:house|flat|work|office|school|place|home|door|apartment|party)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:going to|will|gonna|about to|plan to|planning to|decided to|want to)(?: \w+)? (?:run|mow) (?:over|down) {_TARGET}"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:last day|last thing|last time) (?:some|they|those|these|everyone|people|he|she|all of them|anyone)(?: people)?(?: will)?(?: ever)? (?:see|sees)\b"),
    _r("harm_to_others", "cue", "anger_verb", r"\bmake sure (?:he|she|they) (?:never|can not|will not|wont) (?:hurts?|breathes?|walks?|sees?|touch(?:es)?|does that|hurt anyone|bother)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:throw|drop|shake|hurt|hit|smother|suffocate|drown)(?:ing)? (?:him|her|them|my {KIN}|the {KIN})\b.{{0,40}}\b(?:almost did|nearly did|stairs|against the wall|out the window|just now)\b"),
    _r("harm_to_others", "cue", "target", r"\b(?:know|found out|figured out|know exactly|i know exactly) (?:which|what|where|when)(?: \w+)? (?:he|she|they|my \w+|his \w+|her \w+) (?:drinks|lives|live|works|work|goes|parks|sleeps|eats|trains|walks|leaves|gets off|finishes|is alone|will be|hangs out)"),
    _r("harm_to_others", "high", "intent_target", rf"\bbring(?:ing)? (?:a|my|the|his|her|dads|my dads) {WEAPON} (?:in|into (?:work|school|class|the office))\b"),
    _r("harm_to_others", "cue", "anger", r"\b(?:will not|wont|never) (?:laugh at|bully|mess with|pick on|bother|disrespect|touch) (?:me|anyone|us|my \w+)(?: \w+)? (?:after|again|anymore|any more|ever again)\b|\bi (?:meant|mean) it\b"),
    _r("harm_to_others", "cue", "anger", r"\b(?:get|gets|getting|got) what is coming (?:to (?:him|her|them))?\b|\bteach (?:him|her|them) a lesson\b"),
    _r("harm_to_others", "cue", "weapon", r"\bsomething (?:special |sharp |for (?:him|her|them) )?in my (?:jacket|pocket|bag|car|glovebox|glove box|waistband|boot|trunk|backpack|coat)\b"),
    _r("harm_to_others", "cue", "anger", r"\b(?:not|never) (?:walking|going to walk|walk|getting|get|leaving|leave) (?:away|out)(?: of here)?(?: alive| in one piece)?\b|\bnot leaving (?:here )?alive\b|\b(?:deserves|deserved|had) (?:it|what is coming|to die|to suffer|it coming)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\bput (?:the|a|my|this) {WEAPON} (?:in|into|through) (?:his|her|their|my \w+s?|the \w+s?) (?:neck|chest|back|throat|head|heart|face|stomach|gut|eye)\b"),
    _r("harm_to_others", "high", "intent_target", rf"\b(?:driving|going|heading|walking|on (?:his|my|her) way|riding) (?:over )?to (?:his|her|their|my|the) (?:\w+ ){{0,2}}(?:house|place|work|office|school|flat|home|apartment|job)\b.{{0,30}}\bwith (?:a|his|her|the|my) {WEAPON}"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:cut|cutting|tampered with|tamper with|messed with|loosened) (?:the |his |her |their )?(?:brake|brakes|brake lines|brake cables|wheel nuts|gas line)\b|\b(?:he|she|they) (?:is|are) going to have (?:an|a little|a nasty) accident\b"),
    _r("harm_to_others", "cue", "target", r"\b(?:know|found out|figured out|know exactly) where (?:he|she|they|my \w+|his \w+|her \w+) (?:lives|live|works|work|parks|is staying|goes|sleeps|will be|catches|waits|hangs out)"),
    _r("harm_to_others", "cue", "anger_verb", rf"\b(?:could|want to|wanna|would love to|wish i could|feel like|fantasi[sz]e about|fantasi[sz]ing about|imagine|imagining|dream about|dreaming about|thinking about|think about|going to)(?: \w+)? {_OTHER_VERB} {_TARGET}\b"),
    _r("harm_to_others", "cue", "anger", r"\b(?:hate|furious at|so angry at|rage|revenge|payback|pay for what|get back at|get even)\b"),
    # ---- abuse: threat to life or safety now; past, verbal and controlling abuse as cues
    _r("abuse", "high", "strangulation", r"\b(?:choked|chokes|choking|strangled|strangles|strangling|throttled|throttles)(?: \w+)? (?:me|her|him|us|my \w+)\b|\b(?:hands?|arm|belt|cord|rope|fingers) (?:around|round|on|over|against) (?:my|her|his|your) (?:neck|throat|mouth)\b|\b(?:squeezed|squeezes|squeezing|pressed|presses|grabbed|grabs|grabbing|crushing|crushed) (?:my|her|his|your) (?:neck|throat|windpipe)\b|\b(?:pillow|hand|hands|bag|plastic bag|blanket|towel) (?:over|on|against) (?:my|her|his|your) (?:face|mouth|nose|head)\b|\b(?:held|holds|holding|pushed|pushes|pushing|forced|forces) (?:me|her|him|you|my head|her head|your head) (?:under|underwater|down)\b.{0,20}\b(?:water|bath|pool|river|sea|toilet|sink)|\b(?:he|she|they|\w+) (?:choked|strangled) me\b"),
    _r("abuse", "high", "weapon", rf"\b(?:held|holds|holding|pulled|pulls|pointed|points|pointing|waved|waves|came at (?:me|us|her)|threatened (?:me|us|her) with|put|puts|pressed|presses) (?:a|the|his|her|their) {WEAPON}\b.{{0,30}}\b(?:to|at|against|on|towards?|in front of) (?:me|my|her|us|the kids|our)|\b(?:came at|threatened|chased|attacked|went for) (?:me|us|her|the kids|him) with (?:a|the|his|her)(?: \w+)? {WEAPON}"),
    _r("abuse", "high", "weapon", rf"\b{_ABUSER}(?: \w+){{0,3}} (?:got|gets|has|had|takes|took|pulls|pulled|brings|brought|leaves|left|keeps|kept|puts|put)(?: \w+){{0,2}} {WEAPON} (?:out|on the table|loaded|at me|to my head|on me|under (?:his|her) pillow|next to the bed)"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:said|says|told|tells|threatened|threatens|threatening|swore|swears|keeps saying|kept saying|promised|texted|screamed|yelled|warned)\b.{0,40}\b(?:kill|murder|end|finish|bury) (?:me|us|the kids|you|her|him|them|my \w+|our \w+)\b"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:will|would|is going to|going to|gonna|might|could|is gonna) (?:kill|murder|end) (?:me|us|the kids|her)\b.{0,30}\b(?:if (?:i|she|we) (?:ever )?(?:leave|left|tell|told|try|tried|call|go|report|talk|speak|say|divorce|take the kids)|one day|someday|eventually|next time|for real|this time|and then himself|and then herself|and himself|and herself)"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:afraid|scared|terrified|fear|fearing|worried) (?:for (?:my|her|our) (?:life|lives|safety)|(?:that )?(?:he|she|they) (?:will|is going to|might|could|would) (?:kill|murder) (?:me|us|her|the kids))\b|\b(?:not|never) (?:walk|get|make it) out of (?:that|this|the) (?:house|flat|place|room) alive\b|\bkill me one day\b"),
    _r("abuse", "high", "escalating", rf"\b(?:beatings?|violence|hitting|abuse|attacks?)\b.{{0,50}}\b(?:getting worse|worse and worse|more often|more violent|escalat\w*|every (?:day|night)|harder)\b|\b{_ABUSER}(?: \w+){{0,3}} (?:broke|broken|fractured|cracked|dislocated) (?:my|her|his) (?:ribs?|arm|nose|jaw|wrist|leg|finger|cheek|bones?)"),
    _r("abuse", "high", "physical_now", rf"\b{_ABUSER}(?: \w+){{0,4}} (?:hits|beats|punches|kicks|slaps|hurts|attacks|batters|chokes|burns|whips|drags|throws|shoves|bites|stomps on|beat up|beats up) {_VICTIM}\b(?! (?:at|in) (?:chess|cards|a game|games|tennis|poker|fifa|football|soccer|the race|pool|darts|golf|scrabble|monopoly|running|everything))"),
    _r("abuse", "high", "physical_now", rf"\b{_ABUSER}(?: \w+){{0,4}} (?:hit|beat|punched|kicked|slapped|attacked|battered|burned|whipped|dragged|threw|shoved|pushed|stomped on|beat up) {_VICTIM}\b.{{0,40}}\b(?:last night|yesterday|today|this morning|again|an hour ago|tonight|earlier|this week|just now|every|so hard|harder|still|down the stairs|against the wall|into the wall|until i|till i)"),
    _r("abuse", "high", "physical_now", r"\b(?:with a|with his|with her|using a) (?:belt|bat|stick|cord|cable|hanger|hammer|bottle|pan|board)\b.{0,30}\b(?:beats?|hits?|whips?|hurts?)|\b(?:beats?|hits?|whips?|hurts?) (?:me|us|my \w+|her|him) with (?:a|the|his|her) (?:belt|bat|stick|cord|cable|hanger|hammer|bottle|pan|board|fists?)"),
    _r("abuse", "high", "locked_in", r"\b(?:locks|locked|locking|lock) (?:me|us|her|him|the kids|my \w+) (?:in|inside|up|out)\b(?! (?:of the group|of the chat|on|for talking|of (?:his|her) (?:phone|account|computer)))|\b(?:keeps|kept|shuts|shut) (?:me|us|her|him|the kids|my \w+) (?:locked|in the (?:room|house|basement|bedroom|cellar)|inside|shut in)\b(?! (?:of the group|of the chat|on|for talking|of (?:his|her) (?:phone|account|computer)))|\b(?:will not|wont|does not|doesnt|won't) let (?:me|us|her|him) (?:leave|go out of|out of|get out of) (?:the house|the room|the flat|home|the apartment|the bedroom)\b|\b(?:blocks?|blocking|blocked) (?:the|my) (?:door|doorway|exit)\b|\b(?:hides|hid|took|takes|taken) (?:my|her|our) (?:keys|phone|passport)\b.{0,40}\b(?:can not|cannot|could not|so i|leave|call|escape|get out|trapped)"),
    _r("abuse", "high", "sexual_violence", r"\b(?:forces|forced|forcing|makes|made|pressures|pressured) (?:me|her|him|us) (?:to have sex|into sex|into having sex|to do (?:sexual|things)|to sleep with)\b|\b(?:rapes|raped|raping|molests|molested|molesting) (?:me|her|him|us|my \w+)\b|\b(?:touches|touched|touching|gropes|groped) (?:me|her|him|my \w+)\b.{0,40}\b(?:at night|when|where|private|without|against|says|tell|again)\b|\bcomes? into (?:my|her|his) (?:room|bed) at night\b|\bsexually (?:abuses|abused|abusing|assaults|assaulted|assaulting) (?:me|her|him)\b"),
    _r("abuse", "high", "child_danger", rf"\b{_ABUSER}(?: \w+){{0,3}} (?:hits|beats|hurts|kicks|punches|slaps|burns|shakes|chokes|throws|abuses|touches|is beating|is hitting|is hurting|is kicking|is punching|is slapping|is choking|is strangling|is shaking|is burning) (?:my|the|our|his|her) (?:\w+ ){{0,3}}(?:{KIN}|kids|children|little \w+)\b"),
    _r("abuse", "high", "child_danger", r"\b(?:hear|hearing|heard) (?:them|him|her|the kids|the children|the baby|my \w+) (?:screaming|crying|being hit|being beaten|getting hit)\b.{0,40}\b(?:hit|hitting|beat|beating|hurt|hurting|right now|now)\b"),
    _r("abuse", "high", "locked_in", r"\b(?:been|was|am|are|being|kept|get|got|keeps me|kept me) locked (?:in|inside|up in|up inside) (?:the|a|my|his|her) (?:basement|room|cellar|closet|cupboard|attic|shed|bathroom|bedroom|garage|car|house|flat|boot|trunk)\b"),
    _r("abuse", "high", "sexual_violence", r"\bforces? (?:himself|herself|themselves) (?:on|onto) (?:me|her|him)\b|\b(?:corners|cornered|traps|trapped) (?:me|her)\b.{0,40}\b(?:touch|touches|forces|grabs|kiss|kisses|sex)\b"),
    _r("abuse", "high", "strangulation", r"\b(?:by|around) (?:the|my|her|your|his) (?:neck|throat)\b|\b(?:against|to) the (?:wall|floor|door)\b.{0,20}\bby (?:the|my|her|your) (?:neck|throat|hair)\b"),
    _r("abuse", "high", "physical_now", r"\b(?:drag|drags|dragged|dragging) (?:me|her|him|us|my \w+) (?:by the|by my|by her|across|into|through|out of|along|down the stairs)\b"),
    _r("abuse", "cue", "physical", rf"\b{_ABUSER}(?: \w+){{0,3}} (?:has |had |have )?(?:beaten|hit|punched|kicked|slapped|hurt|attacked|strangled|choked)(?: me| her| us)?\b"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:slit|cut|break|snap|crush|wring) (?:my|her|your|our) (?:throat|neck|windpipe)\b|\b(?:never|not) (?:\w+ ){0,3}(?:leave|get out|walk out|make it out|escape)(?: \w+){0,3} alive\b"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:hurt|kill|beat|punish) (?:me|you|her|him|us) if (?:i|you|she|he|we) (?:ever )?(?:tell|tells|told|say|says|speak|talk|report|leave)\b"),
    _r("abuse", "high", "sexual_violence", r"\b(?:makes|made|making|forces|forced|forcing) (?:me|her|him) (?:do|to do|touch|to touch) (?:things|stuff|sexual things|sex stuff|him|her)\b.{0,20}\b(?:to|for|with|at night|when|and)\b"),
    _r("abuse", "high", "threat_to_kill", r"\bmake sure (?:no one|nobody|no body)(?: will)? (?:ever )?(?:sees?|finds?|hears? from) (?:me|you|her|us)(?: again)?\b|\b(?:he|she|they) (?:will|would|is going to) (?:find|hunt|track) (?:me|you|her|us) (?:down )?(?:and|if)\b"),
    _r("abuse", "high", "threat_to_kill", r"\b(?:sent|texted|messaged|told|said|left|wrote|keeps saying|posted)\b.{0,60}\b(?:you are next|you will be next|you are dead|watch your back|i know where you live|you will regret|your days are numbered|you will not see|you are going to die)\b"),
    _r("abuse", "high", "escalating", r"\b(?:he|she|they) (?:used|uses|brought|grabbed|picked up) (?:a|the|his|her) (?:bat|belt|knife|hammer|stick|bottle|iron|pan|gun|cord|chair)\b.{0,20}\b(?:on me|on her|on us|to hit|yesterday|last night|today)?"),
    _r("abuse", "high", "locked_in", r"\b(?:took|taken|takes|hid|hides|confiscated|kept|keeps|has) (?:my|her) passport\b|\b(?:forced|forcing|making|make|have) (?:me |her )?(?:to )?marry\b|\bhave to marry (?:him|her|a man|someone)\b|\bnot allowed (?:out of|to leave) (?:the house|home|the flat)\b.{0,60}\b(?:passport|phone|marry|locked|took)\b"),
    _r("abuse", "high", "child_danger", r"\b(?:leaves|left|leaving) (?:her|his|their|the|my|our) (?:baby|toddler|kids|children|son|daughter|little \w+|newborn|infant) alone (?:for days|all night|for hours|overnight|for the weekend|for two days|for \w+ days)\b"),
    _r("abuse", "high", "weapon", rf"\b{_ABUSER}(?: \w+){{0,5}} (?:with|holding|waving|carrying|brandishing) (?:a|the|his|her) {WEAPON}\b.{{0,40}}\b(?:at me|at us|at her|in my face|to my head|threat\w*|said|says|screamed|yelled|told|kill|hurt|run|hide|scared|afraid|drunk)\b|\b{_ABUSER} (?:comes|came) (?:home|in|back|round)(?: drunk)? with (?:a|the|his|her) {WEAPON}"),
    _r("abuse", "cue", "abuse", r"\b(?:abuse|abused|abusive|abuser|abusing|domestic violence|domestic abuse|hits me|hit me|beat me|beats me|hurt me|hurts me|assaulted|raped|molested)\b"),
    # ---- medical: overdose taken, poisoning, dangerous intoxication, emergency symptoms
    _r("medical", "high", "overdose_taken", rf"\b(?:took|taken|take|taking|swallowed|swallowing|swallow|downed|ate|eaten|popped|had|necked|chugged|overdosed on|od on)(?: \w+){{0,2}} {QUANTITY}(?: \w+){{0,4}} (?:{MEDS}|bottles?|packets?|packs?|strips?|boxes?|blister packs?|mg|milligrams|grams|units|doses?|of (?:them|it|those|these))\b"),
    _r("medical", "high", "overdose_taken", rf"\b(?:took|taken|swallowed|downed|popped|had) (?:a |some )?(?:little |bit |lot |few )?(?:more|extra|too much|way too much|far too much|more than i should)\b.{{0,40}}\b(?:{MEDS}|bottle|packet|strip|dose)"),
    _r("medical", "high", "overdose_taken", r"\b(?:i|he|she|they|you|my \w+)(?: have| has| had| just| think i| think he| think she)? (?:overdosed|just overdosed|od)\b|\b(?:took|taken|take) an overdose\b|\boverdosing (?:right now|now)\b"),
    _r("medical", "high", "poisoning", r"\b(?:drank|drink|drinking|drunk|swallowed|swallow|ate|eaten|eating|had|took|inhaled|sniffed|licked)(?: \w+){0,5} (?:bleach|antifreeze|anti freeze|cleaning (?:stuff|product|liquid|fluid|spray)|detergent|poison|rat poison|weed killer|weedkiller|pesticide|insecticide|lighter fluid|paint thinner|battery acid|laundry pods?|tide pods?|dishwasher (?:tablets?|pods?)|drain cleaner|oven cleaner|white spirit|turpentine|petrol|gasoline|kerosene|mushrooms? (?:i|he|she) found|berries (?:i|he|she) found|something)\b"),
    _r("medical", "high", "poisoning", r"\b(?:got into|into the|found (?:him|her) (?:with|in)) (?:the )?(?:cleaning|medicine|chemical|bleach|pill|meds) (?:cupboard|cabinet|stuff|bottle|products|drawer)\b|\bcarbon monoxide\b|\bgas (?:leak|smell)\b.{0,30}\b(?:dizzy|headache|sick|faint|passed out)"),
    _r("medical", "cue", "intox", rf"\b(?:drank|drinking|drunk|had|took|taken|taking|swallowed|snorted|injected|smoked|mixed|mixing|popped)\b.{{0,40}}\b(?:vodka|whiskey|whisky|gin|rum|tequila|wine|beer|alcohol|booze|bottle|pills|xanax|benzos?|heroin|coke|cocaine|meth|fentanyl|ketamine|mdma|molly|ecstasy|ghb|opioids?|oxy|painkillers|sleeping pills|{MEDS}|drugs|shots)\b|\boverdose\b"),
    _r("medical", "cue", "intox", r"\b(?:took|take|taking|taken|swallowed|swallow|popped|pop|had|downed)(?: a| some| a few| few| lots| a couple| two| three)? (?:more|extra)\b"),
    _r("medical", "cue", "symptom", r"\b(?:can barely|can not|cannot|could not|struggling to|hard to|trouble) (?:keep (?:my|his|her) eyes open|stay awake|breathe|breath|stand up|stand|wake (?:him|her) up|feel (?:my|his|her) (?:hands|legs|arms|face))\b|\b(?:passing out|passed out|blacking out|blacked out|unconscious|unresponsive|will not wake up|wont wake up|not waking up|can not wake (?:him|her)|cannot wake (?:him|her)|not breathing|stopped breathing|barely breathing)\b|\b(?:vomiting|throwing up|coughing up|puking|peeing) blood\b|\b(?:seizure|seizing|convulsing|fitting|foaming at the mouth)\b|\b(?:lips|face|skin|fingers) (?:are |is |turning |went |gone )?(?:blue|grey|gray)\b|\b(?:breathing|breath) (?:is )?(?:really |very |so )?(?:slow|strange|shallow|weird|funny|rattling|gurgling)\b|\bhearts? (?:is )?(?:racing|pounding|beating so fast|skipping|stopping|going crazy)\b|\b(?:really|very|so) (?:drowsy|sleepy|dizzy|confused)\b|\bgetting (?:really |very |so )?(?:drowsy|sleepy|dizzy|confused)\b|\b(?:throwing up|vomiting|being sick)\b|\b(?:everything is|room is|head is) spinning\b|\bfeel (?:really |so |very )?(?:weird|strange|funny|wrong|numb|faint|sick)\b|\bcan not feel (?:my|his|her) (?:hands|arms|legs|face|fingers)\b|\bringing in (?:my|his|her) ears\b"),
    _r("medical", "high", "symptoms", r"\b(?:crushing|severe|terrible|really bad|sharp|stabbing|tight) (?:chest|heart) pain\b|\bchest pain\b.{0,40}\b(?:arm|jaw|breath|breathe|sweating|left)\b|\b(?:half|one side of|side of) (?:my|his|her) (?:face|body)\b.{0,30}\b(?:numb|drooping|droopy|dropped|gone numb|will not move|can not move|paralysed|paralyzed)\b|\b(?:face|mouth) (?:is )?(?:drooping|droopy)\b|\b(?:slurred|slurring) (?:speech|words|my words)\b|\bwords (?:are )?(?:coming out )?(?:wrong|jumbled|slurred)\b|\b(?:vomiting|throwing up|coughing up|coughing|puking|peeing|pooing) (?:up )?blood\b|\b(?:throat|tongue) (?:is )?(?:closing|swelling|swollen) (?:up)?\b|\bcan not breathe\b.{0,30}\b(?:allergic|swelling|nuts|sting|hives)\b|\bbleeding (?:really |very |so )?(?:heavily|a lot|badly|and (?:it )?(?:will not|wont) stop)\b|\b(?:hit|banged|bumped|smashed) (?:my|his|her) head\b.{0,60}\b(?:confused|vomit|vomiting|throwing up|passed out|blacked out|can not remember|dizzy|blurry)\b|\b(?:collapsed|fainted|passed out|unconscious|unresponsive|will not wake up|wont wake up|not breathing|stopped breathing|seizure|having a fit|turning blue|lips are blue)\b"),
    _r("medical", "high", "alcohol_drugs", r"\b(?:drank|had|drinking|downed|been drinking)\b.{0,40}\b(?:vodka|whisky|whiskey|wine|gin|rum|tequila|alcohol|bottle|beers|drinks)\b.{0,40}\b(?:took|taken|taking|and|with|plus)\b.{0,20}\b(?:valium|xanax|benzos?|diazepam|sleeping pills|sleeping tablets|opioids|oxy\w*|painkillers|heroin|fentanyl|methadone|lorazepam|clonazepam|ativan|ambien|zopiclone|codeine|morphine|tramadol)\b|\b(?:valium|xanax|benzos?|diazepam|sleeping pills|sleeping tablets|opioids|oxy\w*|painkillers|heroin|fentanyl|methadone|lorazepam|clonazepam|codeine|tramadol)\b.{0,40}\b(?:with|and|on top of|washed down with)\b.{0,20}\b(?:vodka|whisky|whiskey|gin|rum|tequila|a (?:whole |full )?bottle|half a bottle|(?:lots|loads|a lot) of (?:alcohol|drinks|beer|wine)|\w+ (?:shots|drinks|beers))\b"),
    _r("medical", "high", "poisoning", r"\bmix\w* (?:bleach|ammonia|chlorine) (?:and|with) (?:ammonia|bleach|vinegar|acid|chlorine|other)\b"),
    _r("medical", "high", "poisoning", rf"\b(?:son|daughter|baby|toddler|kid|child|little \w+|dog|brother|sister|grandson|granddaughter)\b.{{0,20}}\b(?:ate|swallowed|got into|chewed|took|drank|eaten)\b.{{0,30}}\b(?:{MEDS}|medicine|meds|my pills|the pills|her pills|his pills)\b"),
    _r("medical", "high", "symptoms", r"\bspeech (?:is |was )?(?:slurred|slurring|garbled|jumbled)\b|\bcan not (?:move|lift|feel) (?:my|his|her) (?:left|right) (?:arm|leg|side|hand)\b|\b(?:stung|sting|bee|wasp|allergic|nuts|peanuts|shellfish)\b.{0,60}\b(?:can not breathe|swelling|swollen|throat (?:is )?(?:closing|tight))\b|\bblood in (?:it|my vomit|my sick|the toilet|my stool|my poo|my pee|my urine)\b|\b(?:is |are |he is |she is )?(?:not responding|unresponsive)\b(?! to (?:my |her |his )?(?:texts?|messages?|calls?|emails?))"),
    _r("medical", "high", "symptoms", r"\b(?:crushing|severe|terrible|sharp|stabbing|squeezing|heavy|tight) (?:pain|pressure|tightness|ache) in (?:my|his|her|your) chest\b"),
    _r("medical", "cue", "intox", r"\bafter (?:taking )?(?:the|those|these|my|all the|all those|all my) (?:pills|tablets|meds)\b"),
    _r("medical", "cue", "symptom", r"\bcan not (?:catch|get) (?:my|your|his|her) breath\b|\b(?:on|hit) the floor shaking\b"),
    _r("medical", "cue", "intox", r"\bhow many (?:you have|i have|she has|he has|they have|i had|you had) (?:taken|had|swallowed|done)\b"),
    _r("medical", "cue", "intox", r"\b(?:swallow|swallowed|swallowing|took|take|taking|popped|downed) (?:the|all the|my|all my|some|a few|those|these) (?:pills|tablets|meds)\b"),
    _r("medical", "high", "symptoms", r"\b(?:worst|sudden|terrible|severe|thunderclap|exploding) headache\b.{0,50}\b(?:worst of my life|ever had|suddenly|being sick|vomit\w*|throwing up|stiff neck|can not see|confused|passed out)\b|\bworst headache of my life\b"),
    _r("medical", "high", "symptoms", r"\b(?:pregnant)\b.{0,40}\b(?:bleeding|blood|cramps|pain)\b"),
    # ---- round of tuning cases written after the first held-out evaluation (kinds it missed; own words)
    _r("suicide", "high", "preparatory_act", r"\b(?:will not|wont|am not going to|not going to) be (?:around|here|alive) (?:to|after|anymore|any more|much longer|for (?:them|her|him|it))\b"),
    _r("suicide", "high", "euphemism", r"\b(?:make sure|making sure|so that|so) i (?:stay asleep|do not wake up|never wake up|will not wake up|do not wake)\b|\bcheck(?:ing)? out (?:for good|permanently|of (?:life|this world))\b|\b(?:sleep|go to sleep) (?:and|then) (?:never|not) wake up\b"),
    _r("suicide", "high", "method_research", r"\b(?:bridges?|cliffs?|car parks?|multi storey|multi story|rooftops?|roofs?|tower blocks?|quarr(?:y|ies)|platforms?)\b.{0,40}\b(?:no (?:fence|fences|railing|railings|barrier|barriers|nets?|cameras)|without (?:a )?(?:fence|railing|barrier)|high enough|far enough|no coming back|for reasons)\b"),
    _r("suicide", "high", "means", r"\b(?:parked|standing|sitting|waiting) (?:near|at|on|by) the (?:edge|ledge|cliff|bridge|quarry|tracks|platform edge)\b.{0,40}\b(?:deciding|decide|thinking about it|working up|counting|ready|jump)\b|\b(?:quarry|cliff|bridge) edge\b.{0,30}\bdeciding\b"),
    _r("suicide", "high", "reported_speech", r"\b(?:messaged|texted|posted|sent|rang|called|told) (?:me|us|everyone|the group)?\s?(?:saying |to say )?(?:goodbye|bye forever|farewell)\b.{0,60}\b(?:(?:will not|wont|does not|is not|not) (?:pick up|answer|answering|reply|replying|picking up)|sorry for everything|not answering|phone is off|can not reach)\b"),
    _r("self_harm", "high", "escalation", r"\b(?:cutting|burning|hurting|harming|hitting|scratching|carving) (?:myself|herself|himself)\b.{0,40}\b(?:(?:\w+ )?times a day|every (?:day|night|hour)) now\b|\b(?:times a day|every day|every night) now\b.{0,30}\bused to be\b"),
    _r("self_harm", "high", "escalation", r"\b(?:do|doing|cut|cutting|burn|burning|go at) (?:my|his|her) (?:arms?|legs?|thighs?|wrists?|stomach|skin)\b.{0,40}\b(?:deeper|harder|worse|more) than (?:last time|before|ever|usual)\b"),
    _r("harm_to_others", "high", "method_research", r"\b(?:poison|poisons|drug|substance)\b.{0,40}\b(?:not|will not|would not|wont|does not|doesnt|can not) (?:show up|be detected|be traced|show)\b|\bwhere (?:do|should|would|can) (?:you|i|one) (?:stab|shoot|hit|cut) (?:someone|somebody|a person|him|her|them)\b|\bso (?:he|she|they|someone) (?:can not|could not|will not|wont) (?:survive|live|wake up|recover)\b"),
    _r("harm_to_others", "high", "intent_target", r"\b(?:bottle|can|jerry ?can|container)s? (?:\w+ ){0,2}(?:with|of) (?:petrol|gasoline|gas|lighter fluid|paraffin|kerosene)\b.{0,60}\b(?:window|house|flat|door|car|bedroom|letterbox|where (?:he|she|they))\b|\bfilled (?:a|the) (?:bottle|can) with (?:petrol|gasoline|lighter fluid)\b"),
    _r("harm_to_others", "cue", "target", r"\bwait(?:ing)? for (?:them|him|her) (?:after|outside|when|at|near|by)\b|\bknow (?:which|what) (?:window|room|door|car|route|bus) (?:is )?(?:hers|his|theirs|her \w+|his \w+|their \w+)\b"),
    _r("harm_to_others", "high", "euphemism", r"\b(?:will not|wont) be a problem (?:after|by|any more|anymore|for long)\b.{0,60}\b(?:sorted|deal with|handle|take care of|permanently|for good)\b|\bdeal with (?:him|her|them) permanently\b"),
    _r("abuse", "high", "neglect_danger", r"\b(?:without|no) (?:food|water|her (?:medication|medicine|meds|insulin|heart \w+)|his (?:medication|medicine|meds|insulin|heart \w+)|(?:her|his|my) (?:heart|blood pressure|diabetes|epilepsy) (?:medication|medicine|tablets|pills))\b.{0,40}\bfor (?:days|\w+ days|a week|weeks|ages)\b|\bleaves? (?:her|him|them|my \w+) (?:without|with no) (?:food|water|medication|medicine|meds|heating)\b.{0,30}\bfor (?:days|\w+ days|a week|weeks)\b"),
    _r("abuse", "high", "child_danger", r"\b(?:heard|hear|hearing) (?:a )?(?:smack|slap|thud|bang|crack|thump|scream)\b.{0,40}\b(?:went quiet|gone quiet|stopped crying|is not moving|not moving|silent)\b|\b(?:screaming|shouting|yelling) at (?:my|the|our) (?:baby|little|toddler|newborn)\b.{0,60}\b(?:smack|slap|hit|thud|went quiet)\b"),
    _r("abuse", "high", "physical_now", r"\b(?:could not|can not|couldnt) (?:sit|sit down|walk|stand|lie down|lift my arm)(?: down)? for (?:days|a week|\w+ days)\b|\b(?:tonight|next time) (?:will|is going to|would) be worse\b"),
    _r("medical", "high", "serious_injury", r"\b(?:bent|twisted|pointing) (?:the )?wrong way\b|\bbone (?:is )?(?:sticking|poking) out\b|\bcan not (?:feel|move) (?:my|his|her) (?:foot|feet|legs?|arms?|hands?|toes|fingers)\b.{0,30}\b(?:fell|fall|since|after|crash|hit)\b|\b(?:fell|fall|crash|hit)\b.{0,60}\bcan not (?:feel|move) (?:my|his|her) (?:foot|feet|legs?|arms?|hands?|toes)\b"),
]

# ------------------------------------------------------------------------------ modifiers

_NEGATION = re.compile(
    r"\b(?:not|never|no|nor|without|nothing|hardly|neither|no way|no intention|no plans?|no desire|wouldnt|"
    r"refuse to|no longer)\b(?! (?:stop|help|take|bear|cope|handle|wait|breathe|feel|sleep|care|matter|anymore|"
    r"any more|only|just|even|sure|know|realise|realize|understand|notice|one|more|matter|go on|do this|keep|carry|live|exist|longer|be here|"
    r"wake|want to be|want to live|want to exist|want to wake|want to go on|reason|point|purpose|way out|"
    r"future|hope|choice|option|other|idea|escape|matter|have to|need to|worry|deal|be the|see me|hear from|"
    r"be a|be in)\b)(?:\W+\w+){0,4}\W*$")
# a distant, finished past: a hit inside such a clause is lowered to elevated
_PAST_STRONG = re.compile(
    r"\byears ago\b|\b(?:\d+|a|one|two|three|four|five|six|seven|eight|nine|ten|many|several|a few|some|couple of|a couple of) years? ago\b|"
    r"\b(?:a )?long (?:time )?ago\b|\bwhen (?:i|he|she|they|we) (?:was|were) (?:a |in |at |still )?(?:kid|child|little|young|younger|"
    r"teen|teenager|teenagers|student|at school|in school|high school|middle school|college|uni|university|\d+|"
    r"growing up|small|in my teens|in (?:his|her|their) teens|a baby|twelve|thirteen|fourteen|fifteen|sixteen|"
    r"seventeen|eighteen|nineteen|\w+teen|twenty|thirty|forty|fifty)\b|\bas (?:a )?(?:kid|child|teen|teenager|little girl|little boy|young (?:girl|boy|man|woman))\b|"
    r"\bin (?:high|middle|primary|elementary|secondary|grade) school\b|\bback (?:then|in (?:the day|\d+|school|college))\b|"
    r"\bused to\b|\bin the past\b|\bgrowing up\b|\bchildhood\b|\bin my (?:teens|twenties|past|youth|early)\b|\bat the age of\b|"
    r"\bwhen i was (?:\w+ )?(?:\d+|years old)\b|\bhave not (?:done|cut|felt|thought|hurt|had)\b.{0,20}\b(?:since|in (?:\w+ )?(?:years|months))\b|"
    r"\b(?:years|decades) (?:since|before)\b|\bonce,? (?:years|long)\b|\bin (?:19|20)\d\d\b|"
    r"\b(?:thought|felt|tried|attempted|did|considered|said|talked|was)(?: \w+){0,4} once\b(?! (?:the|i|everyone|they|he|she|we|you|my|it|more|again))")
_PAST_WEAK = re.compile(r"\b(?:last|a|one|this past) (?:year|summer|winter|spring|autumn|fall)\b|\bmonths ago\b|"
                        r"\b(?:in|at|during) (?:college|uni|university|my twenties|my thirties|my first year)\b|"
                        r"\ba while (?:ago|back)\b|\bonce\b|\bbefore (?:i|he|she) (?:got|met|moved|started)\b|\bago\b")
_RESOLVED = re.compile(r"\b(?:fine|ok|okay|well|better|good|great|safe|alright|happy|stable|recovered|healthy|"
                       r"doing well|doing better|doing fine|doing great|in a good place|grateful|glad|clean|sober|"
                       r"thriving|in therapy|got help|getting help|over it|moved on|behind (?:me|her|him))\b.{0,20}"
                       r"\b(?:now|these days|today|since|ever since)\b|\b(?:now|these days)\b.{0,30}\b(?:fine|ok|okay|"
                       r"well|better|good|great|safe|happy|stable|recovered|healthy|in a good place|thriving)\b|"
                       r"\b(?:recovered|survived and|got (?:the )?help|is doing (?:really )?(?:well|fine|great|better)|"
                       r"am doing (?:really )?(?:well|fine|great|better)|grateful (?:every day )?(?:that i am|to be) (?:still )?"
                       r"(?:here|alive))\b")
_MEDIA = re.compile(r"\b(?:movie|movies|film|films|tv show|the show|a show|series|episode|episodes|book|books|novel|"
                    r"novels|video game|the game|a game|in game|boss fight|the news|on the news|news story|article|"
                    r"articles|documentary|podcast|song|songs|lyrics|character|characters|anime|manga|netflix|"
                    r"youtube video|essay|lecture|assignment|research paper|paper on|report on|thesis|true crime|"
                    r"headline|headlines|actor|actress|celebrity|singer|rapper|poem|fiction|plot|scene|chapter|"
                    r"finale|villain|protagonist|memoir|biography|autobiography|sermon|for (?:my|a|our) (?:class|course|psychology|homework|project))\b")
_JOKE = re.compile(r"\b(?:lol|lmao|lmfao|rofl|haha\w*|hehe\w*|jk|just kidding|(?<!not )(?<!no )kidding|(?<!not )joking|jokingly|figure of "
                   r"speech|not literally|metaphorically|:\)|xd)\b|\bif i (?:have to|hear|see|get) (?:one more|another|"
                   r"that|this|any more)\b|\bone more (?:meeting|email|call|lecture|class|exam|assignment|day of this)\b")
# idioms and hyperbole: a sentence that only matches through one of these spans is none
IDIOMS = re.compile(
    r"\b(?:is|are|was|were|it is|its|am|been) (?:\w+ )?(?:killing|murdering) me\b|\b(?:kill|killing|murder) for (?:a|an|some)\b|"
    r"\bdying (?:to|for|of laughter|laughing)\b|\b(?:die|died|dying|dead) (?:of|from) (?:embarrassment|shame|boredom|laughter|"
    r"laughing|cuteness|happiness|envy|jealousy|curiosity)\b|\b(?:bored|scared|worried|sick|tired|frightened|stressed) to death\b|"
    r"\bdead (?:tired|on my feet|beat|serious|set|end|ringer|wrong|right)\b|\bkilled it\b|\bkilling it\b|\bto die for\b|"
    r"\bover my dead body\b|\bwould it kill (?:you|him|her|them)\b|\b(?:will|would|going to|gonna|is going to) (?:kill|murder|"
    r"strangle|shoot) (?:me|you|him|her)\b.{0,30}\b(?:if|when) (?:i|she|he|they|you) (?:fail|finds? out|sees?|am late|are late|"
    r"get|gets|do not|dont|forget|forgot|crash|crashed|lose|lost|spend|spent|eat|ate|break|broke|miss|missed|tell|hear|hears|"
    r"come home late|wake)\b|\bshoot (?:me|myself) now\b|\bkill me now\b|\b(?:my )?(?:feet|legs|back|head) (?:are|is) killing\b|"
    r"\bcrawl into a hole and die\b|\bnearly died\b|\balmost died (?:laughing|of)\b|\bthought i (?:was going to|would) die\b"
    r"|\bdrop dead\b|\bkill (?:some )?time\b|\bbeat (?:me|him|her|us) (?:at|in|to)\b|\bkiller (?:workout|headache|app|deal)\b|"
    r"\bgoing to (?:kill|strangle|murder) (?:my|him|her)\b.{0,50}\b(?:haha|lol|if (?:he|she|they) keeps?|eating my|snacks)\b|"
    r"\bcould (?:have |of )?(?:strangled|killed|murdered|throttled|slapped|strangle|kill|murder|throttle) (?:him|her|them|you|my \w+)\b|"
    r"\b(?:felt|feel|feels|feeling) like (?:jumping|throwing myself|killing myself|dying|crying|screaming)\b.{0,50}\b(?:after|because of|during) (?:that|the|this|my|our) (?:exam|test|meeting|day|class|game|match|week|interview|presentation|lecture|shift|date|call)\b|"
    r"\b(?:going to|gonna|will|i will) (?:kill|murder|strangle|throttle) (?:my|him|her)\b.{0,60}\b(?:he|she|they) (?:used|ate|took|borrowed|broke|stole|finished|drank|spilled|lost|hid|forgot)\b|"
    r"\bshoot (?:\w+ ){0,2}(?:a message|a text|an email|a dm|a line|my shot|your shot|a photo|hoops|a video|the breeze)\b|"
    r"\b(?:going to|gonna|will|would|i will|i am going to|could) die (?:if|without|unless|of|from|before|waiting|for)\b|"
    r"\b(?:kill|murder|strangle) (?:me|you|him|her) (?:if|when|for)\b.{0,40}\b(?:crush|secret|surprise|spoil\w*|borrow\w*|dress|clothes|grades|"
    r"homework|my room|late|chocolate|snacks?|crashed|scratch\w*|dent\w*|ruin\w*|spill\w*|the car|her car|his car|curfew|"
    r"phone bill|report card|mess)\b")


NEGATOR = re.compile(r"\b(?:not|never|no way|no intention|refuse to)\b")


def negated(clause: str, start: int) -> bool:
    """A negation word within four words before ``start`` in ``clause`` ("I would never ..."), with no
    "and", "so" or "then" in between ("I can't close it and it keeps bleeding" is not negated)."""
    m = _NEGATION.search(clause[:start])
    return m is not None and not re.search(r"\b(?:and|so|then|because|which|while|until)\b", clause[m.start():start])


def resolved(turn: str) -> bool:
    """The turn says a risk is over ("she's doing well now", "I got help")."""
    return _RESOLVED.search(turn) is not None


def past_resolved(clause: str, turn_resolved: bool) -> bool:
    """A finished past: a distant-past marker in the clause, or a recent one in a turn that says it
    is resolved ("years ago", "when I was a teenager"; "last year ... she's doing well now")."""
    if _PAST_STRONG.search(clause):
        return _RESOLVED.search(clause) is not None or _PRESENT_NOW.search(clause) is None
    return turn_resolved and _PAST_WEAK.search(clause) is not None


_PRESENT_NOW = re.compile(r"\b(?:right now|again|today|tonight|last night|this (?:week|morning|evening)|"
                          r"lately|recently|these days|currently|started again|every day now|now (?:i|it|he|she|they) "
                          r"(?:am|is|are|have|has|keep|keeps|started|want|wants))\b")


_LEISURE = re.compile(r"\b(?:bungee|skydiv\w*|parachut\w*|paraglid\w*|scuba|diving board|trampoline|climbing wall|"
                      r"zip ?lin\w*|roller ?coaster|theme park|ski jump|high dive|cliff diving|base jump\w*|hunting|"
                      r"shooting range|gun range|the range|clay pigeon|gun club|target practice|deer season|"
                      r"abseil\w*|rock climbing|hiking|trek|skiing|snowboard\w*)\b")


_DENIAL = re.compile(
    r"\b(?:would|will|could|am|do|did)(?: not| never)(?: ever| actually| really)? (?:do it|do anything|act on (?:it|them|that)|"
    r"go through with it|hurt (?:myself|anyone|him|her|them)|kill myself|try it|leave (?:them|my \w+))\b|\bnever (?:actually )?"
    r"(?:do it|do anything|act on (?:it|them)|go through with it)\b|\b(?:no|not any|do not have (?:a|any)|have no) "
    r"(?:plans?|intention|intent|means)(?: to)?\b|\bnot (?:suicidal|going to (?:do|act|hurt|kill|try) (?:anything|it|myself))\b|"
    r"\bi promise i (?:will not|wont)\b|\bi am safe\b")


_STOPPED = re.compile(r"\b(?:put (?:it|them|the \w+) (?:down|away|back)|threw (?:it|them|the \w+) away|(?:called|texted|rang) "
                      r"(?:my|a|the) \w+(?: \w+)? instead|did not do it|stopped myself|talked myself out of it|"
                      r"flushed (?:them|it)|gave (?:them|it) to)\b")


def stopped(turn: str) -> bool:
    """The client says they stopped ("I had the razor in my hand but I put it down")."""
    return _STOPPED.search(turn) is not None


def denial(turn: str) -> bool:
    """The client says they will not act ("I'd never go through with it", "I don't have a plan")."""
    return _DENIAL.search(turn) is not None


_HEAD_CAPS = {  # sentence contexts in which the embedding head alone never gives high
    "benign_dose": re.compile(r"\b(?:usual dose|normal dose|my dose|as prescribed|prescribed|my doctor|the doctor|"
                              r"for (?:my|a|the) (?:back|head|headache|migraine|pain|period|cramps|cold|flu|allergies|"
                              r"hay fever|tooth|toothache|fever|anxiety|depression|sleep))\b"),
    "cooking": re.compile(r"\b(?:cooking|cook|recipe|kitchen knives|chef|dinner party|baking|bake|chopping|carving the)\b"),
    "relationship": re.compile(r"\b(?:end (?:it|things) with|break up|broke up|breaking up|dump(?:ed|ing)?|divorce)\b"),
    "protective": re.compile(r"\b(?:threw away|thrown away|throw away|got rid of|get rid of|flushed|locked (?:them|it) "
                             r"away|to (?:hold|keep|look after) (?:them|it|for me)|safety plan|coping|therapist|"
                             r"counsell?or|crisis line|helpline|hotline|thankfully|luckily|found them all)\b"),
    "accident": re.compile(r"\b(?:accidentally|by accident|by mistake|a nick|just a nick|shaving|shave|paper cut|"
                           r"chopping|slipped|clumsy)\b"),
    "sleep_aid": re.compile(r"\b(?:to help me sleep|help me sleep|slept|fell asleep|to get to sleep|for sleep|jet lag)\b"),
    "social": re.compile(r"\b(?:fireworks|festival|concert|picnic|sunset|the view|take photos|with my (?:friends|mates|"
                         r"family|kids)|with (?:the kids|friends))\b"),
    "outdoors": re.compile(r"\b(?:ladder|swing|treehouse|tree house|camping|tent|boat|sailing|climbing|hammock|"
                           r"washing line|clothesline)\b"),
    "venting": re.compile(r"\b(?:scream|screaming|yell|yelling|shout|shouting|vent|venting|rant|ranting|annoyed|"
                          r"irritat\w*|frustrat\w*)\b"),
}


def head_caps(sentence: str, turn_denied: bool) -> set[str]:
    """Why the head's high is lowered for this sentence: a denial in its turn (``denial(turn)``, read
    once a turn by the caller), a resolved or distant past, or a benign context (a usual dose, cooking,
    a breakup, a protective step, venting)."""
    caps = {name for name, pat in _HEAD_CAPS.items() if pat.search(sentence)}
    if turn_denied:
        caps.add("denial")
    if (_PAST_STRONG.search(sentence) and not _PRESENT_NOW.search(sentence)) or _RESOLVED.search(sentence):
        caps.add("past")
    return caps


_ORDINARY = {  # rule name -> the everyday context that explains it (counts as none, like fiction)
    "preparatory_act": re.compile(r"\b(?:moving (?:to|away|abroad|house|out|into)|emigrat\w*|relocat\w*|retir\w*|"
                                  r"new job|leaving (?:my|the) job|last day at|wedding|the baby|graduat\w*|tiny flat|"
                                  r"smaller (?:flat|place|house)|downsiz\w*|declutter\w*|grown up)\b"),
    "means": re.compile(r"\b(?:organi[sz]er|dosette|pill ?box|blister pack|so i do not forget|prescription|pharmacy|"
                        r"chemist|as prescribed)\b"),
    "method_research": re.compile(r"\b(?:pharmacology|toxicology|nursing|medical school|med school|exam|exams|revision|"
                                  r"revising|textbook|lecture|tutorial|module|my course|my degree|for work as a)\b"),
    "symptom": re.compile(r"\bpanic attacks?\b|\b(?:it|they) (?:passes|pass|goes away|go away|settles?) after\b"),
}
_ORDINARY["prep"] = _ORDINARY["preparatory_act"]


def ordinary(rule_name: str, sentence: str) -> bool:
    """An everyday context explains what the rule found (goodbye cards before a move, tablets sorted
    into a weekly organiser, a toxic dose asked about for an exam, a panic attack that passes)."""
    pat = _ORDINARY.get(rule_name)
    return pat is not None and pat.search(sentence) is not None


def media(clause: str) -> bool:
    """Fiction, news or coursework is being talked about."""
    return _MEDIA.search(clause) is not None


def leisure(clause: str) -> bool:
    """A leisure activity (bungee jumping, hunting) explains heights or weapons."""
    return _LEISURE.search(clause) is not None


def joke(sentence: str) -> bool:
    return _JOKE.search(sentence) is not None


def idiom_spans(sentence: str) -> list[tuple[int, int]]:
    return [m.span() for m in IDIOMS.finditer(sentence)]
