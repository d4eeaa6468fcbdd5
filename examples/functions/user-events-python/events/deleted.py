"""Runs for every removed row in the users table; only the old image is left."""


def handler(event):
    user = event["old_image"]
    print(f"User deleted: {user['id']}")
