# Types of captioning/__init__.py's lazily loaded names (SPEC 1 lazy loading): checkers and editors read this file.
from captioning.inference.model import CaptionModel as CaptionModel
from captioning.inference.model import CaptionResult as CaptionResult
from captioning.inference.model import load as load

__version__: str
__all__ = ["load", "CaptionModel", "CaptionResult"]
