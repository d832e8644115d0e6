"""The speculative-decoding engine and its trace format. The app imports this package; never the reverse."""
