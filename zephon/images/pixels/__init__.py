"""The pixel definition: encoded bytes -> RGB uint8 -> resized -> patches, and the
canary that checks another machine makes the same pixels."""
