"""`python -m streams`: run the Faust worker (logs at warn level unless -l is given)."""

import sys

from streams.app import app

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "-l", "warn", *sys.argv[1:]]
    app.main()
