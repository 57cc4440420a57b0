"""The policy: levels and thresholds of every finding code, loaded from YAML, evaluated purely."""
