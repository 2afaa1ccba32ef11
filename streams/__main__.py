"""`python -m streams`: run the Faust worker (logs at warning level unless -l is given)."""

import sys

from streams.app import app

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", "warning", *sys.argv[1:]]
    app.main()
