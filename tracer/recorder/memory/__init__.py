"""Memory recording: the storages ops make, their frees and what they are kept for
(``memory_recorder``), in a storage table (``storage_table``; its C twin is the hot path's)."""
