"""The `ibemu` command line."""
