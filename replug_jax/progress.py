"""Progress bars: tqdm's notebook widget where ipywidgets is installed, its text bar everywhere else. Without
ipywidgets, `tqdm.auto` (ours, and huggingface_hub's at its import) would warn "IProgress not found" in a notebook
and fall back to the text bar anyway; that one warning is silenced, since the text bar is what runs."""
import importlib.util
import warnings

if importlib.util.find_spec("ipywidgets") is not None:
    from tqdm.auto import tqdm
else:
    from tqdm import tqdm
    from tqdm.std import TqdmWarning

    warnings.filterwarnings("ignore", message="IProgress not found", category=TqdmWarning)

__all__ = ["tqdm"]
