from mcsim.cli import main

# Guarded: worker processes started by spawn (``--processes``) import this module as ``__mp_main__``.
if __name__ == "__main__":
    main()
