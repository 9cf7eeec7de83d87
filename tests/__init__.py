"""The test suite: a package, so that its suites can mirror the modules of ``zombie_pipeline`` by name."""
