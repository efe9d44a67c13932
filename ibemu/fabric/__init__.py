"""ibemu.fabric"""
