"""The jobs `python -m replug_jax.main` runs: they read configs and call the libraries with plain arguments.

Running a job: the command line (`command_line`), every setting checked
before a model loads (`input_checks`), what every job prepares (`prepare`: documents, datastore, index, encoder,
LM, a trained retriever), results files and reports (`results_file`, `report`, `downstream_report`,
`window_report`), bucket workdirs (`bucket_workdirs`), and the jobs themselves: `lm_eval`, `lsr`, `downstream`
(QA and multiple choice, with `downstream_choices`). Only this layer and main.py read configs; no job imports another.

Layer: below the entry points and the public API (main, serve, launch, api, replug); imports every other layer.
main.py's `run_job` runs the job a config names, so no module here imports the jobs but the jobs' own helpers.
"""

JOBS = ("lm_eval", "lsr", "qa", "mmlu")  # what `config.job` may name
