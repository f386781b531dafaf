"""What every layer may use: the user-error type (`errors`), atomic writes (`atomic_files`), the console's phase lines
and the log file (`console`), progress bars (`progress`).

Layer: the lowest. Imports nothing of the package (docs/architecture.md; the contract in .importlinter).
"""
