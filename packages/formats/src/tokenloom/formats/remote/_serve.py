"""``python -m tokenloom.formats.remote._serve``: the object-store helper process (see ``helper.py``)."""

from tokenloom.formats.remote.helper import serve

if __name__ == "__main__":
    serve()
