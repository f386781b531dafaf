"""Progress bars: tqdm's notebook widget where ipywidgets is installed, its text bar everywhere else. Without
ipywidgets, `tqdm.auto` (ours, and huggingface_hub's at its import) would warn "IProgress not found" in a notebook
and fall back to the text bar anyway; that one warning is silenced, since the text bar is what runs."""
import importlib.util
import inspect
import warnings

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm
    from tqdm.std import TqdmWarning

    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)

__all__ = ["progress_keyword", "tqdm"]


def progress_keyword(method, progress) -> dict:
    """The keyword that asks an LM's `method` (its `score`, `score_with_query` or `generate`) for its progress
    (True: its own bar; a callable: told of the work done), given only where wanted and taken: the contract above
    has no `progress`, which the project's own LMs (local, HTTP, cached) all take; a user's black box is called
    without it."""
    if not progress:
        return {}
    params = inspect.signature(method).parameters.values()
    takes = any(p.name == "progress" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    return {"progress": progress} if takes else {}
