"""Crisis safety: the check of a conversation, and the reply that names where to get help at high risk.

The package's parts: ``types`` (levels, categories, ``RiskAssessment``, ``Hit`` and the metric
helpers), ``cases`` (the crisis data sets), ``lexicon`` (vocabulary and normalisation), ``rules``
(per-sentence patterns and modifiers), ``turns`` (the rules over a conversation's client turns),
``backbone`` and ``heads`` (the two fitted heads), ``classifier`` (``RiskClassifier``), ``reply``
(``safety_reply``), ``evaluation`` and ``cli`` (``escrag safety eval`` / ``fit-heads``). Nothing is
imported here: callers import the part they use.

The classifier: ``RiskClassifier`` (``from_config(cfg)``, ``assess(history)``, ``assess_many(histories)``),
``RiskAssessment`` (level none / elevated / high, categories, reasons), the metric helpers
(``with_answer``, ``level_counts``), the embedding head fitted on
``data/safety/tuning.jsonl``, the crisis data sets' reader (``load_cases``) and ``safety_reply``.
Three layers use it: the counselor API (every reply), the GRPO rollouts and the evaluation (a
reported metric). The categories and levels are those of docs/safety.md.

How a conversation is read (every client turn, not only the last one):
1. Rules (``escrag.safety.rules``) on each sentence of each client turn, after normalisation
   (contractions, chat spellings, misspelt risk words repaired by edit distance). A high rule under a
   negation ("I would never ...") or in a resolved past ("years ago ... she's fine now") counts as
   elevated; inside fiction, news, a joke or an idiom ("this exam is killing me") it does not count.
2. Combinations of cues across the whole conversation (``COMBOS``): ideation in one turn and means at
   hand or a time in another is high ("I don't see the point" ... "I've got my dad's pills").
3. An answer to the counselor's risk question ("Do you have a plan?" "yes").
4. The embedding head: a multinomial logistic regression on all-MiniLM-L6-v2 embeddings of single
   sentences, fitted on the tuning set with multiple-instance rounds (a high conversation needs only
   one high sentence). It catches phrasings the rules lack; a sentence the rules found negated, past,
   fictional or idiomatic is capped at elevated.
The level of 1-4 is the highest level found; ``reasons`` says what fired on which words.
5. The conversation head (``escrag.safety.heads``, ``safety.backbone``): P(high) from a language
   model's reading of the whole conversation (to confirm 1-4's high: the highest over its prefixes
   that end at a client turn, so a later turn cannot talk an earlier risk away). High when it is
   sure (``conv_high``), or when 1-4 said high and it agrees at least a little (``conv_confirm``; below that, 1-4's high is lowered to
   elevated, except a yes to the counselor's direct question, ``FIRM``); at least elevated above
   ``conv_elevated``. On round 6's dev half this cut the misses
   and the false alarms of 1-4 alone (experiments/safety_designs).

A screening aid that errs towards flagging, not a clinical instrument. The paper has no safety
layer; this is ours.
"""
