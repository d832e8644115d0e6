"""What a drafter kind says when it refuses a setting: a leaf module, so that a drafter's own
module and the registry (which imports every drafter's module in its builders) can both read
the same words without importing each other."""

OTHER_TOKENIZER_GREEDY_ONLY = (
    "the other-tokenizer drafter runs only greedy (temperature 0): the ratio test needs the "
    "draft's probability of each target token, which exists only for strings both vocabularies "
    "share (Timor et al., ICML 2025); use --temperature 0, or a drafter that shares the target's tokenizer")
