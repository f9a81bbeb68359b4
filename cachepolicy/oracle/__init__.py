"""The exactness oracle (``kvagent check-exact``): edited paths against one uninterrupted
prefill, bitwise.  ``checks`` holds the single checks, ``sweeps`` the split-point and
chunk sweeps, ``lanes`` the decode-lane checks, ``encoder`` the vision encoder's."""
