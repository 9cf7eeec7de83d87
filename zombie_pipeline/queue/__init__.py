"""The deployment's documents and how to reach them: names, generations, collections, connections, indexes.

Nothing here decides what a zombie is or writes on the deployment's behalf; the
cleanup and the statistics build on it.
"""
