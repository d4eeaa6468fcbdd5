"""Run as `python -m app.main`: the relative import below needs the package."""

import os

import uvicorn
from fastapi import FastAPI

from .routes import router

app = FastAPI(title="fastapi-service")
app.include_router(router)

if __name__ == "__main__":
    uvicorn.run(app, host="0.0.0.0", port=int(os.environ["PORT"]))  # noqa: S104 - in its container
