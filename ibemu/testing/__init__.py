"""Test doubles shipped with ibemu (like ``trio.testing``)."""
