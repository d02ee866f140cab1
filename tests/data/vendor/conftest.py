"""Vendor files are test data, read by tests/test_nki_corpus_vendor.py: never collected."""

collect_ignore_glob = ["*"]
