"""The fault-injection suite is long (each case runs a recipe two or three times): the default ``pytest`` keeps
only the cases marked ``fast``; ``pytest -m faults`` (any -m naming ``faults``) runs every case."""


def pytest_collection_modifyitems(config, items):
    if "faults" in (config.getoption("markexpr") or ""):
        return
    drop = [i for i in items if i.get_closest_marker("faults") and not i.get_closest_marker("fast")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [i for i in items if i not in drop]
