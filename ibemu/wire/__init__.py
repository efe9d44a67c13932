"""ibemu.wire"""
