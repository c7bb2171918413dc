import streamlit as st

st.title("train")
