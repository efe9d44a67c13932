"""ibemu.sm"""
