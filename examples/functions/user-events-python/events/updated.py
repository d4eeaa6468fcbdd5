"""Runs for every changed row in the users table (its rule allows 20s)."""


def handler(event):
    user = event["new_image"]
    print(f"User updated: {user['id']}")
