"""ibemu.kernel"""
