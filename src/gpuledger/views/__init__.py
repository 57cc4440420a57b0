"""What people and programs read: the text tables of ``ls`` and ``check``, and the metrics."""
