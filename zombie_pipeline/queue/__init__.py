"""The deployment's documents and how to reach them: one module per collection with its fields and its writes,
the generations, the store, connections, indexes, and the embedded default database.

Nothing here decides what a zombie is; the cleanup and the statistics build on it.
"""
