from mcsim.cli import console

# Guarded: worker processes started by spawn (``--processes``) import this module as ``__mp_main__``.
if __name__ == "__main__":
    console()
