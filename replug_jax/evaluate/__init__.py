"""Evaluations as in the paper: perplexity and bits per byte over windows (`lm`, `windows`), open-domain QA with
ensembled generation (`qa`, `qa_posterior`, `answer_nll`), multiple choice (`mmlu`, `option_text`, `olmes_tasks`).
Functions of an LM, a retriever's results and texts; numbers out, no files written.

Layer: imports `data`, `lm`, `retrieval`, `method` and below; never `train` (and `train` never imports it).
"""
