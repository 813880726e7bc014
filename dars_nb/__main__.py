"`python -m dars_nb` is the `dars` command."
import sys
from dars_nb.cli import main

if __name__ == '__main__': sys.exit(main())
