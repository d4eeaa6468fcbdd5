import six


def handler(event):
    print(f"six {six.__version__} from requirements.txt")
