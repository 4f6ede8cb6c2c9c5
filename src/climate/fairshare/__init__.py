"""Fair share: usage rules checked at admission and the external admission hook
(docs/fair-share.md)."""
