from typing import Any


def handler(event: dict[str, Any]) -> None:
    print("NESTED " + str(event.get("n")))
