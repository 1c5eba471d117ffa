"""Qt-free state the views observe: the open chat and the model library."""
from .chat import ChatState, GenerationRequest
from .library import LibraryState, LibraryRow, human_bytes, human_count

__all__ = ["ChatState", "GenerationRequest", "LibraryState", "LibraryRow", "human_bytes", "human_count"]
