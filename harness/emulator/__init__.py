"""Emulated device-side services for exercising the harness without a phone.

`harness.emulator.adbd` speaks the device side of adb's transport protocol over
loopback TCP, so the real adb server (`adb connect 127.0.0.1:PORT`) and
`adbutils` can drive it like a Snapdragon handset.
"""
