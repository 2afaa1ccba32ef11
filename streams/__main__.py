"""`python -m streams`: run the Faust worker (logs at warn level unless -l is given).

Faust's web server is off: it would bind 0.0.0.0:6066 even with web_enabled=False.
"""

import sys

from streams.app import app

if __name__ == "__main__":
    sys.argv = [sys.argv[0], "worker", "--without-web", "-l", "warn", *sys.argv[1:]]
    app.main()
