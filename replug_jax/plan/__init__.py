"""The TPU plan (`python -m replug_jax.plan`): every device program a job runs, compiled for a TPU slice by the real
TPU compiler on any machine (libtpu), with its memory, estimated time and MFU per chip, and the job's chip-hours.

Modules: `programs` (the jobs' own jitted functions over abstract arguments on a TPU mesh), `costs` (what the
compiler says of one program, and its two traps), `workload` (a config's phases: programs, shapes and calls),
`planner` (compiles them, checks the fit, adds up the job), `report` (tables and JSON).

Layer: an entry point beside main, serve and launch; imports `jobs` (the command line, the settings' checks) and the
libraries' program builders below (lm, retrieval, train, models, parallel); nothing imports it.
"""
