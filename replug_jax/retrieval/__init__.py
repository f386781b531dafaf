"""Retrieval: the datastore of passages, the dense encoder, embeddings on disk, the FAISS index and exact search,
BM25, the retriever interface over them, and the refresher that swaps a fresh index in during LSR.

Layer: imports `models`, `parallel`, `base`; never `lm`, `data` or anything above.
"""
