"""ibemu.switch"""
