"""Makes conf/ the package ``i2d2._conf`` (see setup.py), so the configs ship inside the wheel."""
