"""REPLUG's method as pure functions of arrays and texts: the per-token mixture and λ (`mixture`), the LM's
posterior over passages as weights (`posterior`), the LSR objective (`lsr_loss`), the passes a document makes with
an input and the QA prompt's blocks (`passages`). No model, no file, no config: a notebook can call each one.

Layer: above `base`; beside `models`, which it never imports; below `lm`, `retrieval` and all that uses them.
"""
