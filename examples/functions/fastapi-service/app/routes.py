from fastapi import APIRouter

router = APIRouter()


@router.get("/health")
def health() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/items/{item_id}")
def item(item_id: int) -> dict[str, int]:
    return {"item_id": item_id}
