"""The Tinker API served by OpenRFT (docs/tinker.md); needs the ``tinker`` extra (the SDK's types)."""
