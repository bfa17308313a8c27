"""Problems, answer checking, reasoning steps, and loading models and datasets (local or hub): no training here."""
