"""Runs for every new row in the users table."""


def handler(event):
    user = event["new_image"]
    print(f"User created: {user['id']}")
