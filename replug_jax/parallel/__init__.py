"""Many devices and many processes: meshes, shardings and fixed-shape batches (`sharding`), joining JAX processes
(`distributed`), the key-value store they agree through (`host_store`, `host_store_client`), XLA's CPU options per
program (`xla_cpu`). `python -m replug_jax.launch` starts N local processes of one command.

Layer: above `base`, below everything else; imports `base` alone.
"""
