"""ibemu.hca"""
