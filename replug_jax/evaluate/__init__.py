"""Evaluations as in the paper: perplexity and bits per byte over windows (`lm`, `windows`), open-domain QA with
ensembled generation (`qa`, `qa_posterior`, `answer_nll`), multiple choice (`multiple_choice`: one flow for MMLU's prompts and OLMES's requests, scoring by
`mmlu`'s option letters or `option_text`'s option texts).
Functions of an LM, a retriever's results and texts; numbers out, no files written.

Layer: imports `data`, `lm`, `retrieval`, `method` and below; never `train` (and `train` never imports it).
"""
