"""Which commit this gpuledger was built from: ``scripts/build-release`` writes the commit into
the copy it packages; a checkout says ``unknown``."""

COMMIT = "unknown"
