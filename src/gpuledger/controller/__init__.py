"""The node controller: the pure join, the loop and its history."""
